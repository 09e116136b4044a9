//! Mutations of an input: byte-level edits, integers that sit at the edges of the types a
//! header stores (lengths, counts, offsets), numbers in text, splices with other inputs of the
//! corpus, and a target's own tokens (keys, type tags, JSON fragments): enough structure for
//! mutated files to get past magic numbers and into the code behind them.

use crate::rng::Rng;

/// Integers that break length and offset arithmetic.
const EDGES: [u64; 30] = [
    0,
    1,
    2,
    3,
    4,
    7,
    8,
    16,
    31,
    32,
    64,
    127,
    128,
    255,
    256,
    1024,
    4096,
    0x7fff,
    0x8000,
    0xffff,
    0x1_0000,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_fffe,
    0xffff_ffff,
    1 << 32,
    1 << 40,
    i64::MAX as u64,
    1 << 63,
    u64::MAX,
];

/// What a mutation may use besides the input itself.
pub struct Material<'a> {
    /// Other inputs to splice from.
    pub corpus: &'a [Vec<u8>],
    /// Tokens of the input's format.
    pub dictionary: &'a [&'a [u8]],
    /// Longest input to make.
    pub max_len: usize,
}

/// Applies one to eight random mutations to `input`.
pub fn mutate(rng: &mut Rng, input: &mut Vec<u8>, material: &Material<'_>) {
    let rounds = 1 + (rng.next_u64().trailing_zeros() as usize).min(7);
    for _ in 0..rounds {
        mutate_once(rng, input, material);
    }
    input.truncate(material.max_len);
}

fn mutate_once(rng: &mut Rng, input: &mut Vec<u8>, material: &Material<'_>) {
    let len = input.len();
    match rng.below(13) {
        0 if len > 0 => {
            let at = rng.below(len);
            input[at] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let at = rng.below(len);
            input[at] = rng.next_u64() as u8;
        }
        2 | 3 => put_edge_integer(rng, input),
        4 if len > 0 => add_to_integer(rng, input),
        5 if len > 0 => {
            let start = rng.below(len);
            let end = (start + span(rng, len)).min(len);
            input.drain(start..end);
        }
        6 => {
            let at = rng.below(len + 1);
            let count = span(rng, 64);
            let byte = rng.next_u64() as u8;
            let bytes: Vec<u8> = match rng.one_in(2) {
                true => vec![byte; count],
                false => (0..count).map(|_| rng.next_u64() as u8).collect(),
            };
            input.splice(at..at, bytes);
        }
        7 if len > 0 => {
            let start = rng.below(len);
            let end = (start + span(rng, len)).min(len);
            let copy = input[start..end].to_vec();
            let at = rng.below(len + 1);
            input.splice(at..at, copy);
        }
        8 => splice(rng, input, material.corpus),
        9 | 10 => {
            if let Some(&token) = rng.pick(material.dictionary) {
                let at = rng.below(len + 1);
                match rng.one_in(2) {
                    true => {
                        input.splice(at..at, token.iter().copied());
                    }
                    false => {
                        let end = (at + token.len()).min(len);
                        input.splice(at..end, token.iter().copied());
                    }
                }
            }
        }
        11 if len > 0 => input.truncate(rng.below(len)),
        12 => replace_decimal(rng, input),
        _ => {}
    }
}

/// A span length from 1 that is mostly short: up to 16, or now and then up to `limit`.
fn span(rng: &mut Rng, limit: usize) -> usize {
    let longest = match rng.one_in(8) {
        true => limit.max(1),
        false => limit.clamp(1, 16),
    };
    1 + rng.below(longest)
}

/// Writes an edge integer (or one next to it) of 1, 2, 4 or 8 bytes, either byte order, over
/// the input at a random place.
fn put_edge_integer(rng: &mut Rng, input: &mut Vec<u8>) {
    let width = 1 << rng.below(4);
    let mut value = EDGES[rng.below(EDGES.len())];
    match rng.below(4) {
        0 => value = value.wrapping_add(1),
        1 => value = value.wrapping_sub(1),
        _ => {}
    }
    let bytes = match rng.one_in(4) {
        true => value.to_be_bytes()[8 - width..].to_vec(),
        false => value.to_le_bytes()[..width].to_vec(),
    };
    let at = rng.below(input.len() + 1);
    let end = (at + width).min(input.len());
    input.splice(at..end, bytes);
}

/// Adds a small signed amount to a little-endian integer of 1, 2, 4 or 8 bytes in the input.
fn add_to_integer(rng: &mut Rng, input: &mut [u8]) {
    let width = (1usize << rng.below(4)).min(input.len());
    let at = rng.below(input.len() - width + 1);
    let mut bytes = [0u8; 8];
    bytes[..width].copy_from_slice(&input[at..at + width]);
    let delta = rng.below(33) as u64;
    let value = match rng.one_in(2) {
        true => u64::from_le_bytes(bytes).wrapping_add(delta),
        false => u64::from_le_bytes(bytes).wrapping_sub(delta),
    };
    input[at..at + width].copy_from_slice(&value.to_le_bytes()[..width]);
}

/// Replaces part of the input with part of another corpus entry.
fn splice(rng: &mut Rng, input: &mut Vec<u8>, corpus: &[Vec<u8>]) {
    let Some(other) = rng.pick(corpus) else {
        return;
    };
    if other.is_empty() {
        return;
    }
    let from = rng.below(other.len());
    let to = from + 1 + rng.below(other.len() - from);
    let at = rng.below(input.len() + 1);
    let end = match rng.one_in(2) {
        true => input.len(),
        false => (at + (to - from)).min(input.len()),
    };
    input.splice(at..end, other[from..to].iter().copied());
}

/// Replaces a run of ASCII digits (a number in a text format) with another number: an edge
/// integer, negative, huge, or fractional.
fn replace_decimal(rng: &mut Rng, input: &mut Vec<u8>) {
    let starts: Vec<usize> = (0..input.len())
        .filter(|&i| input[i].is_ascii_digit() && (i == 0 || !input[i - 1].is_ascii_digit()))
        .collect();
    let Some(&start) = rng.pick(&starts) else {
        return;
    };
    let end = (start..input.len())
        .find(|&i| !input[i].is_ascii_digit())
        .unwrap_or(input.len());
    let edge = EDGES[rng.below(EDGES.len())];
    let text = match rng.below(6) {
        0 => format!("-{edge}"),
        1 => format!("{edge}0000000000"),
        2 => format!("{edge}.5e308"),
        3 => "1e-400".to_string(),
        _ => edge.to_string(),
    };
    input.splice(start..end, text.into_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_keep_to_the_length_limit_and_change_inputs() {
        let corpus = vec![b"GGUF\x03\x00\x00\x00".to_vec(), b"{\"type\": 1}".to_vec()];
        let dictionary: [&[u8]; 2] = [b"general.alignment", b"\"start\""];
        let material = Material {
            corpus: &corpus,
            dictionary: &dictionary,
            max_len: 64,
        };
        let mut rng = Rng::new(7);
        let mut changed = 0;
        for case in 0..10_000 {
            let mut input = corpus[case % 2].clone();
            mutate(&mut rng, &mut input, &material);
            assert!(input.len() <= 64);
            changed += usize::from(input != corpus[case % 2]);
        }
        assert!(changed > 9_000, "only {changed} of 10000 inputs changed");
    }
}
