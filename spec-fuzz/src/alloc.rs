//! A global allocator that counts the bytes a parse holds at its peak, so that the harness can
//! fail a parse whose memory is out of proportion to its input (a length field believed before
//! the file is checked to hold that much), and refuses single requests past a hard cap: such a
//! request ends the process (Rust's allocation-failure abort) before the machine's memory runs
//! out, and the input it died on is still on disk.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

/// Single allocations larger than this, while a parse is watched, fail.
pub const HARD_CAP: u64 = 1 << 30;

static WATCHING: AtomicBool = AtomicBool::new(false);
/// Bytes allocated minus bytes freed since the watch began (frees of older blocks make it
/// negative).
static HELD: AtomicI64 = AtomicI64::new(0);
static PEAK: AtomicI64 = AtomicI64::new(0);

/// The system allocator, counting while [`watch`] runs.
pub struct CountingAllocator;

impl CountingAllocator {
    /// Counts `size` more bytes held; false when the request is to be refused.
    fn admit(size: usize) -> bool {
        if !WATCHING.load(Ordering::Relaxed) {
            return true;
        }
        if size as u64 > HARD_CAP {
            return false;
        }
        let held = HELD.fetch_add(size as i64, Ordering::Relaxed) + size as i64;
        PEAK.fetch_max(held, Ordering::Relaxed);
        true
    }

    fn release(size: usize) {
        if WATCHING.load(Ordering::Relaxed) {
            HELD.fetch_sub(size as i64, Ordering::Relaxed);
        }
    }
}

// SAFETY: every call is passed on to `System` unchanged (or refused with a null pointer, which
// `GlobalAlloc` allows); the counting touches only atomics and never allocates.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match Self::admit(layout.size()) {
            // SAFETY: the caller's layout contract is passed on as it is.
            true => unsafe { System.alloc(layout) },
            false => std::ptr::null_mut(),
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match Self::admit(layout.size()) {
            // SAFETY: as for `alloc`.
            true => unsafe { System.alloc_zeroed(layout) },
            false => std::ptr::null_mut(),
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        Self::release(layout.size());
        // SAFETY: `ptr` was allocated by `System` with `layout` (the caller's contract).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !Self::admit(new_size) {
            return std::ptr::null_mut();
        }
        Self::release(layout.size());
        // SAFETY: `ptr` and `layout` come from `System` (the caller's contract), `new_size` is
        // the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Runs `f`, returning its result and the most bytes it held at once (0 when
/// [`CountingAllocator`] is not the global allocator). Watches are not nested.
pub fn watch<R>(f: impl FnOnce() -> R) -> (R, u64) {
    HELD.store(0, Ordering::Relaxed);
    PEAK.store(0, Ordering::Relaxed);
    WATCHING.store(true, Ordering::SeqCst);
    let result = f();
    WATCHING.store(false, Ordering::SeqCst);
    (result, PEAK.load(Ordering::Relaxed).max(0) as u64)
}
