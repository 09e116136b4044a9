//! Bytes that start on a cache line, so that the kernels' 64-byte loads of a panel's chunks
//! never straddle two lines.

#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// A byte buffer whose first byte is 64-byte aligned.
#[derive(Clone, Debug)]
pub(crate) struct CacheAligned {
    lines: Vec<Line>,
    len: usize,
}

impl CacheAligned {
    pub fn zeroed(len: usize) -> Self {
        Self {
            lines: vec![Line([0; 64]); len.div_ceil(64)],
            len,
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `lines` holds at least `len` initialized bytes, and u8 has no alignment.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr() as *const u8, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr() as *mut u8, self.len) }
    }
}
