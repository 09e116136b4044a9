//! `general.alignment` read from a GGUF header before candle's reader sees the file: candle
//! rounds the tensor data's offset up to it without checking it (an alignment of 0 panics the
//! reader), and falls back to 32 for one stored as another type than an integer of at most 32
//! bits.
//!
//! The scan walks the header as candle's reader does (versions 1 to 3, every value type,
//! arrays nested at most 64 deep, keys compared after dropping trailing NULs, the last of
//! repeated keys winning), skipping every value but the alignment's.

use std::io::{self, Read};

/// The metadata key of the tensor data's alignment.
const ALIGNMENT_KEY: &[u8] = b"general.alignment";

/// Values nested in more arrays than this are refused by candle's reader (and by this scan).
const MAX_VALUE_DEPTH: usize = 64;

/// `general.alignment` as a header stores it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum StoredAlignment {
    /// An integer of a type candle's reader takes (8, 16 or 32 bits, signed or not).
    Integer(i64),
    /// A value of a type candle's reader ignores, by the name of its type.
    Ignored(&'static str),
}

impl StoredAlignment {
    /// Why tensor data cannot be laid out by it, if it cannot: it must be a power of two
    /// stored as an integer candle's reader takes.
    pub(super) fn problem(self) -> Option<String> {
        match self {
            Self::Integer(value) if u64::try_from(value).is_ok_and(u64::is_power_of_two) => None,
            Self::Integer(value) => Some(value.to_string()),
            Self::Ignored(value_type) => Some(format!("stored as {value_type}")),
        }
    }
}

/// The last `general.alignment` of the GGUF header `reader` starts at, `None` when it has
/// none. Fails where the header cannot be read (not GGUF, truncated, an unknown value type),
/// as candle's reader does.
pub(super) fn read_alignment(reader: &mut impl Read) -> io::Result<Option<StoredAlignment>> {
    let magic = read_u32(reader)?;
    if magic != u32::from_le_bytes(*b"GGUF") && magic != u32::from_be_bytes(*b"GGUF") {
        return Err(invalid(format!("not a GGUF file (magic {magic:#010x})")));
    }
    let header = match read_u32(reader)? {
        1 => Header {
            wide_lengths: false,
        },
        2 | 3 => Header { wide_lengths: true },
        version => return Err(invalid(format!("GGUF version {version}"))),
    };
    let _tensor_count = header.read_length(reader)?;
    let entries = header.read_length(reader)?;
    let mut alignment = None;
    for _ in 0..entries {
        let key_len = header.read_length(reader)?;
        let is_alignment = key_is(reader, key_len, ALIGNMENT_KEY)?;
        let value_type = read_u32(reader)?;
        if is_alignment {
            alignment = Some(header.read_alignment_value(reader, value_type)?);
        } else {
            header.skip_value(reader, value_type, 0)?;
        }
    }
    Ok(alignment)
}

/// How a header's lengths are stored.
struct Header {
    /// 64-bit lengths (versions 2 and 3), else 32-bit (version 1).
    wide_lengths: bool,
}

impl Header {
    fn read_length(&self, reader: &mut impl Read) -> io::Result<u64> {
        if self.wide_lengths {
            read_u64(reader)
        } else {
            read_u32(reader).map(u64::from)
        }
    }

    /// Reads a value of type `value_type` as the alignment (skipping it when it is not an
    /// integer candle's reader takes).
    fn read_alignment_value(
        &self,
        reader: &mut impl Read,
        value_type: u32,
    ) -> io::Result<StoredAlignment> {
        let integer = match value_type {
            0 => i64::from(read_array::<1>(reader)?[0]),
            1 => i64::from(i8::from_le_bytes(read_array(reader)?)),
            2 => i64::from(u16::from_le_bytes(read_array(reader)?)),
            3 => i64::from(i16::from_le_bytes(read_array(reader)?)),
            4 => i64::from(read_u32(reader)?),
            5 => i64::from(i32::from_le_bytes(read_array(reader)?)),
            _ => {
                self.skip_value(reader, value_type, 0)?;
                return Ok(StoredAlignment::Ignored(type_name(value_type)));
            }
        };
        Ok(StoredAlignment::Integer(integer))
    }

    /// Reads past a value of type `value_type`, `depth` arrays deep.
    fn skip_value(&self, reader: &mut impl Read, value_type: u32, depth: usize) -> io::Result<()> {
        if depth > MAX_VALUE_DEPTH {
            return Err(invalid(format!(
                "values nested more than {MAX_VALUE_DEPTH} arrays deep"
            )));
        }
        if let Some(bytes) = fixed_size(value_type) {
            return skip(reader, bytes);
        }
        match value_type {
            8 => {
                let len = self.read_length(reader)?;
                skip(reader, len)
            }
            9 => {
                let element_type = read_u32(reader)?;
                let len = self.read_length(reader)?;
                match fixed_size(element_type) {
                    Some(bytes) => skip(
                        reader,
                        len.checked_mul(bytes)
                            .ok_or_else(|| invalid(format!("an array of {len} values")))?,
                    ),
                    None => {
                        (0..len).try_for_each(|_| self.skip_value(reader, element_type, depth + 1))
                    }
                }
            }
            _ => Err(invalid(format!("unknown GGUF value type {value_type}"))),
        }
    }
}

/// Bytes of a value of a fixed-size type, `None` for strings, arrays and unknown types.
fn fixed_size(value_type: u32) -> Option<u64> {
    match value_type {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

/// The name of a GGUF value type, as the specification spells it.
fn type_name(value_type: u32) -> &'static str {
    match value_type {
        0 => "a uint8",
        1 => "an int8",
        2 => "a uint16",
        3 => "an int16",
        4 => "a uint32",
        5 => "an int32",
        6 => "a float32",
        7 => "a bool",
        8 => "a string",
        9 => "an array",
        10 => "a uint64",
        11 => "an int64",
        12 => "a float64",
        _ => "an unknown type",
    }
}

/// Whether the next `len` bytes, a key, are `key` followed by nothing but NULs (which candle's
/// reader drops); reads past them either way.
fn key_is(reader: &mut impl Read, len: u64, key: &[u8]) -> io::Result<bool> {
    let key_len = key.len() as u64;
    if len < key_len {
        skip(reader, len)?;
        return Ok(false);
    }
    let mut start = vec![0; key.len()];
    reader.read_exact(&mut start)?;
    let mut rest = reader.take(len - key_len);
    let mut chunk = [0u8; 256];
    let mut only_nuls = true;
    loop {
        let read = rest.read(&mut chunk)?;
        if read == 0 {
            break;
        }
        only_nuls &= chunk[..read].iter().all(|&b| b == 0);
    }
    if rest.limit() > 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(start == key && only_nuls)
}

/// Reads past `bytes` bytes.
fn skip(reader: &mut impl Read, bytes: u64) -> io::Result<()> {
    let skipped = io::copy(&mut reader.take(bytes), &mut io::sink())?;
    if skipped < bytes {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

fn read_array<const N: usize>(reader: &mut impl Read) -> io::Result<[u8; N]> {
    let mut bytes = [0; N];
    reader.read_exact(&mut bytes)?;
    Ok(bytes)
}

fn read_u32(reader: &mut impl Read) -> io::Result<u32> {
    read_array(reader).map(u32::from_le_bytes)
}

fn read_u64(reader: &mut impl Read) -> io::Result<u64> {
    read_array(reader).map(u64::from_le_bytes)
}

fn invalid(reason: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, reason)
}
