#![doc = include_str!("../README.md")]
//!
//! ## In detail
//!
//! - Formats: Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K ([`Format`]), repacked at load into panels of
//!   16 interleaved rows (same bytes per weight), one row per register lane, which halves the
//!   multiplications of multi-token passes (the private `panels` module documents the layout).
//! - Instruction sets ([`Isa`]): AVX-512 VNNI (`vpdpbusd`), AVX2 + FMA + F16C, and portable Rust,
//!   chosen at run time: a path runs only where the CPU has every extension it is compiled
//!   with. All three give **bit-identical** results: integer
//!   dot products are exact, and the float arithmetic after them is the same sequence of
//!   fused multiply-adds in every path (the `panels` module's documentation states the contract).
//! - **Batch-invariant**: a token's result does not depend on how many tokens share the call
//!   or on how rows are split among threads, so verifying k draft tokens in one forward gives
//!   each exactly the logits decoding it alone gives (lossless greedy speculation needs this).
//! - Activations are quantized to 8 bits per block of 32 (K-quants: 256) values, as llama.cpp
//!   does.

mod activations;
mod aligned;
pub mod attention;
mod formats;
mod panels;
mod pool;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, DefaultHasher};
use std::ops::Range;
use std::sync::Mutex;

use crate::activations::QuantizedTokens;
use crate::aligned::CacheAligned;
pub use crate::formats::{dequantize_block, Format};
use crate::pool::Pool;

/// What can go wrong.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KernelError {
    #[error("a {format:?} row of {cols} weights is not a whole number of {block}-weight blocks")]
    RaggedRow {
        format: Format,
        cols: usize,
        block: usize,
    },
    #[error("{what} holds {got} bytes or values, {expected} expected")]
    WrongLength {
        what: &'static str,
        got: usize,
        expected: usize,
    },
    #[error("row {row} of a matrix of {rows} rows")]
    RowOutOfRange { row: usize, rows: usize },
    #[error("the {0:?} instruction set is not available on this CPU")]
    Unsupported(Isa),
    #[error("{what} would take {count} × {each}, more than a usize can count")]
    TooLarge {
        what: &'static str,
        count: usize,
        each: usize,
    },
}

/// An instruction set the kernels can use. A path runs only where the CPU (and OS) has every
/// extension its kernels are compiled with; [`QMatrix::matmul_with`] refuses one that is
/// missing with [`KernelError::Unsupported`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// AVX-512 F/BW/VL and VNNI, with AVX2, FMA and F16C: `vpdpbusd` on 512-bit registers, the
    /// 16 rows of a panel at once.
    Avx512Vnni,
    /// AVX2, FMA and F16C: `vpmaddubsw` + `vpmaddwd`.
    Avx2,
    /// Plain Rust.
    Portable,
}

impl Isa {
    /// The fastest instruction set this CPU has (detected once).
    pub fn best() -> Isa {
        static BEST: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| fastest(Isa::available))
    }

    /// Every instruction set, fastest first.
    pub fn all() -> [Isa; 3] {
        [Isa::Avx512Vnni, Isa::Avx2, Isa::Portable]
    }

    /// Whether this CPU can run it: it has every extension the path is compiled with.
    pub fn available(self) -> bool {
        match self {
            Isa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            _ => x86::available(self),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }
}

/// The first of [`Isa::all`] that `available` accepts, and the portable path at the latest.
fn fastest(available: impl Fn(Isa) -> bool) -> Isa {
    Isa::all()
        .into_iter()
        .find(|&isa| isa == Isa::Portable || available(isa))
        .unwrap_or(Isa::Portable)
}

/// A quantized weight matrix `[rows, cols]` in a GGUF block format (rows are outputs).
#[derive(Clone, Debug)]
pub struct QMatrix {
    format: Format,
    rows: usize,
    cols: usize,
    data: CacheAligned,
}

impl QMatrix {
    /// Wraps ggml-layout bytes: `rows` rows of `cols / block_len` blocks each.
    pub fn new(
        format: Format,
        rows: usize,
        cols: usize,
        data: Vec<u8>,
    ) -> Result<Self, KernelError> {
        if cols == 0 || !cols.is_multiple_of(format.block_len()) {
            return Err(KernelError::RaggedRow {
                format,
                cols,
                block: format.block_len(),
            });
        }
        let row_bytes = checked_size(
            "a row of the weight data",
            cols / format.block_len(),
            format.block_bytes(),
        )?;
        let expected = checked_size("the weight data", rows, row_bytes)?;
        if data.len() != expected {
            return Err(KernelError::WrongLength {
                what: "the weight data",
                got: data.len(),
                expected,
            });
        }
        let data = panels::to_panels(format, rows, cols, &data);
        Ok(Self {
            format,
            rows,
            cols,
            data,
        })
    }

    pub fn format(&self) -> Format {
        self.format
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes of a panel of 16 rows.
    fn panel_bytes(&self) -> usize {
        self.cols / self.format.block_len() * panels::panel_block_bytes(self.format)
    }

    /// Row `r` dequantized (`cols` values), e.g. an embedding lookup.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) -> Result<(), KernelError> {
        if r >= self.rows {
            return Err(KernelError::RowOutOfRange {
                row: r,
                rows: self.rows,
            });
        }
        check_len("the output row", out.len(), self.cols)?;
        let n = self.panel_bytes();
        let (p, lane) = (r / panels::PANEL_ROWS, r % panels::PANEL_ROWS);
        let bytes = panels::panel_block_bytes(self.format);
        for (block, out) in self.data.as_slice()[p * n..(p + 1) * n]
            .chunks_exact(bytes)
            .zip(out.chunks_exact_mut(self.format.block_len()))
        {
            panels::dequantize_row(self.format, block, lane, out);
        }
        Ok(())
    }

    /// `out[t, r] = Σ_c self[r, c] · x[t, c]` for `tokens` rows of `x` (`[tokens, cols]`,
    /// row-major; `out` is `[tokens, rows]`), with the fastest instruction set, on the kernels'
    /// thread pool (one thread per core, or `SPECVOICE_THREADS`).
    pub fn matmul(&self, x: &[f32], tokens: usize, out: &mut [f32]) -> Result<(), KernelError> {
        self.matmul_with(Isa::best(), x, tokens, out)
    }

    /// [`QMatrix::matmul`] with a chosen instruction set.
    pub fn matmul_with(
        &self,
        isa: Isa,
        x: &[f32],
        tokens: usize,
        out: &mut [f32],
    ) -> Result<(), KernelError> {
        Self::matmul_many_with(isa, &[self], x, tokens, &mut [out])
    }

    /// [`QMatrix::matmul`] of several matrices with the same input (a layer's query, key and
    /// value projections, say) in one pass on the pool: `outs[i]` = `matrices[i]` · x. The input
    /// is quantized once, and one wait for the threads serves them all.
    pub fn matmul_many(
        matrices: &[&QMatrix],
        x: &[f32],
        tokens: usize,
        outs: &mut [&mut [f32]],
    ) -> Result<(), KernelError> {
        Self::matmul_many_with(Isa::best(), matrices, x, tokens, outs)
    }

    /// [`QMatrix::matmul_many`] with a chosen instruction set.
    pub fn matmul_many_with(
        isa: Isa,
        matrices: &[&QMatrix],
        x: &[f32],
        tokens: usize,
        outs: &mut [&mut [f32]],
    ) -> Result<(), KernelError> {
        if !isa.available() {
            return Err(KernelError::Unsupported(isa));
        }
        check_len("the outputs", outs.len(), matrices.len())?;
        let Some(cols) = matrices.first().map(|m| m.cols) else {
            return Ok(());
        };
        for (m, out) in matrices.iter().zip(outs.iter()) {
            check_len("a matrix's columns", m.cols, cols)?;
            check_len(
                "the output",
                out.len(),
                checked_size("the output", tokens, m.rows)?,
            )?;
        }
        check_len(
            "the input",
            x.len(),
            checked_size("the input", tokens, cols)?,
        )?;
        if tokens == 0 {
            return Ok(());
        }
        let pool = Pool::global();
        let ahead = MATMUL_ORDER
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .record(matrices);
        pool.expect_next(ahead.as_slice());
        SCRATCH.with_borrow_mut(|scratch| {
            let Scratch {
                tasks,
                by_32,
                by_256,
                outs: finals,
            } = scratch;
            guided_tasks(matrices, pool.threads(), tasks);
            // Each task writes its rows of every token of a chunk into the caller's `[tokens,
            // rows]` layout, where a token's 16 rows of a panel are one contiguous run.
            finals.clear();
            finals.extend(outs.iter_mut().map(|out| SharedOut::new(out)));
            let needs = |block: usize| matrices.iter().any(|m| m.format.block_len() == block);
            let (needs_32, needs_256) = (needs(32), needs(256));
            // Batches go in chunks that bound the activations a row meets to what stays in
            // L1/L2.
            for first in (0..tokens).step_by(MAX_TOKENS_PER_PASS) {
                let n = MAX_TOKENS_PER_PASS.min(tokens - first);
                let x = &x[first * cols..(first + n) * cols];
                if needs_32 {
                    by_32.quantize(x, n, cols, 32);
                }
                if needs_256 {
                    by_256.quantize(x, n, cols, 256);
                }
                let (by_32, by_256) = (needs_32.then_some(&*by_32), needs_256.then_some(&*by_256));
                pool.run(tasks.len(), &|task| {
                    let (i, rows) = &tasks[task];
                    let m = matrices[*i];
                    let acts = match m.format.block_len() {
                        32 => by_32,
                        _ => by_256,
                    };
                    let acts = acts.expect("quantized for every block length in use");
                    let out = TaskOut {
                        out: &finals[*i],
                        total_rows: m.rows,
                        first_row: rows.start,
                        rows: rows.len(),
                        first_token: first,
                        tokens: n,
                    };
                    m.rows_dot(isa, rows.clone(), acts, &out);
                });
            }
            // No pointer into the caller's outputs outlives the call.
            finals.clear();
        });
        Ok(())
    }

    /// Row `rows.start + i` · token t into `out`'s row i of token t, for the tokens of `acts`
    /// (`rows.start` a multiple of 16).
    fn rows_dot(&self, isa: Isa, rows: Range<usize>, acts: &QuantizedTokens, out: &TaskOut<'_>) {
        let panel_bytes = self.panel_bytes();
        let panels = rows.start / panels::PANEL_ROWS..rows.end.div_ceil(panels::PANEL_ROWS);
        let data = &self.data.as_slice()[panels.start * panel_bytes..panels.end * panel_bytes];
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni | Isa::Avx2 => {
                x86::panels_dot(isa, self.format, data, rows.len(), acts, out);
            }
            _ => {
                for (p, panel) in data.chunks_exact(panel_bytes).enumerate() {
                    let first = p * panels::PANEL_ROWS;
                    let here = panels::PANEL_ROWS.min(rows.len() - first);
                    panels::panel_dot(self.format, panel, here, acts, out, first);
                }
            }
        }
    }
}

/// The order in which matmuls follow each other, learned as they run: a forward repeats the
/// same sequence of matrices, so the one that followed a matmul last time is the one the pool's
/// idle workers warm the caches with while the caller does the serial work between the two.
#[derive(Default)]
struct MatmulOrder {
    /// The first matrix (its data address) of the latest matmul.
    previous: Option<usize>,
    /// For each matmul's first matrix, the byte ranges of the matmul that came after it.
    successors: HashMap<usize, WarmList, BuildHasherDefault<DefaultHasher>>,
}

/// How far ahead the idle workers warm: the matmuls after the current one until this many
/// bytes (at least the next one), about half a SmolLM2-135M layer. Where memory is slow (an
/// AVX2 machine reading 15 GB/s) this took about 5 % off SmolLM2's one-token forward after 150
/// cached tokens (medians of 20 alternated runs); where it is fast (33 GB/s) the gain was
/// within the noise, and on the 0.5B and 1.5B it is within the noise on both. On a Xeon
/// reading 36 GB/s with a large L3 it does pay: without the warming SmolLM2's forward took
/// 5 % longer and the 0.5B's 1–4 % (alternated three times); half or twice this distance
/// measured the same.
const WARM_AHEAD_BYTES: usize = 1 << 20;

/// Matmuls remembered before the order is forgotten (models loaded and dropped over a long run
/// leave stale addresses behind; a forward of the largest supported model has a few hundred).
const MAX_REMEMBERED_MATMULS: usize = 8192;

static MATMUL_ORDER: Mutex<MatmulOrder> = Mutex::new(MatmulOrder {
    previous: None,
    successors: HashMap::with_hasher(BuildHasherDefault::new()),
});

impl MatmulOrder {
    /// Notes that `matrices` run now; returns the memory of the matmuls that came after them
    /// last time, [`WARM_AHEAD_BYTES`] ahead.
    fn record(&mut self, matrices: &[&QMatrix]) -> WarmList {
        let ranges = WarmList::of(matrices);
        let key = ranges.first_address();
        if let Some(previous) = self.previous.replace(key) {
            if self.successors.len() >= MAX_REMEMBERED_MATMULS {
                self.successors.clear();
            }
            self.successors.insert(previous, ranges);
        }
        let mut ahead = WarmList::default();
        let mut at = key;
        while let Some(next) = self.successors.get(&at) {
            if next.first_address() == key
                || ahead.bytes() >= WARM_AHEAD_BYTES
                || !ahead.extend(next)
            {
                break;
            }
            at = next.first_address();
        }
        ahead
    }
}

/// The `(address, length)` of the matrices of a matmul or a few consecutive ones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct WarmList {
    ranges: [(usize, usize); pool::MAX_WARM_RANGES],
    count: usize,
}

impl WarmList {
    fn of(matrices: &[&QMatrix]) -> Self {
        let mut list = Self::default();
        for m in matrices.iter().take(pool::MAX_WARM_RANGES) {
            let bytes = m.data.as_slice();
            list.ranges[list.count] = (bytes.as_ptr() as usize, bytes.len());
            list.count += 1;
        }
        list
    }

    fn as_slice(&self) -> &[(usize, usize)] {
        &self.ranges[..self.count]
    }

    fn first_address(&self) -> usize {
        self.ranges[0].0
    }

    fn bytes(&self) -> usize {
        self.as_slice().iter().map(|r| r.1).sum()
    }

    /// Appends `other`'s ranges; `false` (and nothing appended) when they do not fit.
    fn extend(&mut self, other: &WarmList) -> bool {
        let total = self.count + other.count;
        if total > pool::MAX_WARM_RANGES {
            return false;
        }
        self.ranges[self.count..total].copy_from_slice(other.as_slice());
        self.count = total;
        true
    }
}

/// This crate's version, e.g. to tag measurements that depend on the kernels.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// A fingerprint of the kernels' source (FNV-1a of every module): measurements that depend on
/// the kernels' speed, such as cached forward costs, are keyed by it, so that a change to the
/// kernels measures them again even when [`VERSION`] stays the same.
pub const SOURCE_FINGERPRINT: u64 = fnv1a(&[
    include_str!("lib.rs"),
    include_str!("x86.rs"),
    include_str!("panels.rs"),
    include_str!("formats.rs"),
    include_str!("activations.rs"),
    include_str!("pool.rs"),
    include_str!("aligned.rs"),
]);

const fn fnv1a(texts: &[&str]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325_u64;
    let mut t = 0;
    while t < texts.len() {
        let bytes = texts[t].as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            hash = (hash ^ bytes[i] as u64).wrapping_mul(0x0100_0000_01b3);
            i += 1;
        }
        t += 1;
    }
    hash
}

pub use pool::set_threads;

/// Threads the kernels run on (one per core, `SPECVOICE_THREADS`, or [`set_threads`]).
pub fn threads() -> usize {
    Pool::global().threads()
}

/// The size of this machine's last-level cache, as Linux reports it for CPU 0 (`None` where
/// it does not).
pub fn last_level_cache_bytes() -> Option<usize> {
    let caches = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    caches
        .filter_map(|entry| {
            let dir = entry.ok()?.path();
            let level: u32 = std::fs::read_to_string(dir.join("level"))
                .ok()?
                .trim()
                .parse()
                .ok()?;
            let size = parse_cache_size(&std::fs::read_to_string(dir.join("size")).ok()?)?;
            Some((level, size))
        })
        .max()
        .map(|(_, size)| size)
}

/// Bytes in a cache size as sysfs writes it: `307200K`, `32M`, `512`.
fn parse_cache_size(text: &str) -> Option<usize> {
    let text = text.trim();
    let (digits, shift) = match text.chars().last()? {
        'K' => (&text[..text.len() - 1], 10),
        'M' => (&text[..text.len() - 1], 20),
        'G' => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    digits.parse::<usize>().ok()?.checked_mul(1 << shift)
}

/// Bytes a read must cycle through so that the caches cannot hold a useful part of it: at
/// least `floor`, and four times the last-level cache (some Xeons have 300 MiB of L3).
pub fn beyond_caches(floor: usize) -> usize {
    floor.max(4 * last_level_cache_bytes().unwrap_or(0))
}

/// This machine's memory read bandwidth in GB/s with `threads` threads (best of twenty sums
/// over a buffer of at least 512 MiB and four times the last-level cache, held the way the
/// kernels hold weights; every other sum asks for its lines ahead as the kernels do, the rest
/// leave that to the hardware, and the faster of the two ways counts): the limit of one-token
/// decoding, which reads every weight once.
pub fn read_bandwidth_gbs(threads: usize) -> f64 {
    let threads = threads.max(1);
    // In the buffer the weights live in, so that it reads through the same pages (zeroed by
    // writing, so they are in memory, not the shared zero page).
    let bytes = CacheAligned::zeroed(beyond_caches(512 << 20));
    // SAFETY: any eight bytes are a valid u64, and the buffer is 64-byte aligned, so all of
    // it is words.
    let (_, buffer, _) = unsafe { bytes.as_slice().align_to::<u64>() };
    let words = buffer.len();
    let mut best = 0f64;
    for round in 0..20 {
        let prefetch = round % 2 == 0;
        let started = std::time::Instant::now();
        let total = std::thread::scope(|s| {
            let handles: Vec<_> = buffer
                .chunks(words.div_ceil(threads))
                .map(|part| s.spawn(move || sum_words(part, prefetch)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(0))
                .fold(0, u64::wrapping_add)
        });
        std::hint::black_box(total);
        best = best.max((words * 8) as f64 / started.elapsed().as_secs_f64() / 1e9);
    }
    best
}

/// The wrapping sum of `words` (the memory probe's read), `prefetch` as [`x86::sum_words`]'s.
fn sum_words(words: &[u64], prefetch: bool) -> u64 {
    #[cfg(target_arch = "x86_64")]
    return x86::sum_words(words, prefetch);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = prefetch;
        words.iter().fold(0, |a, &x| a.wrapping_add(x))
    }
}

/// What a thread that calls the kernels reuses from one matmul to the next: the task list, the
/// quantized activations and the outputs' pointers. A SmolLM2-135M forward runs about 150
/// matmuls, and each allocated and freed these anew (and every task its tiles), on a heap
/// whose bookkeeping the matmul before had pushed out of the caches: glibc's `free` took 3 %
/// of both threads' samples in a one-token forward, 0.6 % after. With both reused, the
/// one-token forward after 64 cached tokens took 2.51 ms against 2.67 (means of five runs of
/// `forward_loop` alternated with the binary before, a Zen 5 machine).
#[derive(Default)]
struct Scratch {
    tasks: Vec<(usize, Range<usize>)>,
    by_32: QuantizedTokens,
    by_256: QuantizedTokens,
    outs: Vec<SharedOut<f32>>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
}

/// Tokens quantized and multiplied in one pass over the weights.
const MAX_TOKENS_PER_PASS: usize = 64;

/// The row ranges one pass hands out, in order, by guided self-scheduling: each task takes
/// 1 / (2 · threads) of the rows still left (whole panels of 16, within one matrix). The first
/// tasks are large, so there are few hand-outs; the last are a panel or two, so the threads
/// finish nearly together instead of one waiting out the other's last large task.
fn guided_tasks(matrices: &[&QMatrix], threads: usize, tasks: &mut Vec<(usize, Range<usize>)>) {
    let mut left: usize = matrices.iter().map(|m| m.rows).sum();
    tasks.clear();
    for (i, m) in matrices.iter().enumerate() {
        let mut start = 0;
        while start < m.rows {
            let share = left
                .div_ceil(2 * threads)
                .next_multiple_of(panels::PANEL_ROWS);
            let end = m.rows.min(start + share);
            tasks.push((i, start..end));
            left -= end - start;
            start = end;
        }
    }
}

/// Runs `job(i)` for every `i` in `0..tasks` on the kernels' threads, the caller's included,
/// and returns when all have finished; a panicking job panics the caller. For the work between
/// matmuls (attention, element-wise functions): it runs on the threads that are already awake
/// for the matmuls instead of waking a second pool that would compete with them for the cores.
pub fn parallel_for(tasks: usize, job: &(dyn Fn(usize) + Sync)) {
    Pool::global().run(tasks, job);
}

/// Runs `job(index, chunk)` for the consecutive chunks of `chunk` values of `out` (the last may
/// be shorter) with [`parallel_for`].
pub fn parallel_chunks_mut<T: Send>(
    out: &mut [T],
    chunk: usize,
    job: &(dyn Fn(usize, &mut [T]) + Sync),
) {
    let chunk = chunk.max(1);
    let len = out.len();
    let shared = SharedOut::new(out);
    parallel_for(len.div_ceil(chunk), &|index| {
        let start = index * chunk;
        // SAFETY: every index owns its own chunk, and `out` is borrowed until all have run.
        job(index, unsafe {
            shared.range(start..len.min(start + chunk))
        });
    });
}

/// A buffer that tasks write disjoint ranges of.
struct SharedOut<T> {
    ptr: *mut T,
    len: usize,
}

// SAFETY: tasks only touch disjoint ranges (see `range`), and `T` may move between threads.
unsafe impl<T: Send> Sync for SharedOut<T> {}

impl<T> SharedOut<T> {
    fn new(out: &mut [T]) -> Self {
        Self {
            ptr: out.as_mut_ptr(),
            len: out.len(),
        }
    }

    /// # Safety
    /// No two live ranges may overlap, and the buffer must outlive them.
    #[allow(clippy::mut_from_ref)]
    unsafe fn range(&self, range: Range<usize>) -> &mut [T] {
        assert!(range.start <= range.end && range.end <= self.len);
        std::slice::from_raw_parts_mut(self.ptr.add(range.start), range.end - range.start)
    }
}

/// One task's share of a `[tokens, total_rows]` output: rows `first_row..first_row + rows` of
/// tokens `first_token..first_token + tokens`. Tasks own disjoint rows of the same tokens.
pub(crate) struct TaskOut<'a> {
    out: &'a SharedOut<f32>,
    total_rows: usize,
    first_row: usize,
    rows: usize,
    first_token: usize,
    tokens: usize,
}

impl TaskOut<'_> {
    /// Tokens of the task.
    pub(crate) fn tokens(&self) -> usize {
        self.tokens
    }

    /// The task's rows `row..row + len` of its token `t`, contiguous in the output.
    ///
    /// # Safety
    /// No other live slice of the task's may overlap it (other tasks own other rows).
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn rows_of(&self, t: usize, row: usize, len: usize) -> &mut [f32] {
        assert!(t < self.tokens && row + len <= self.rows);
        let start = (self.first_token + t) * self.total_rows + self.first_row + row;
        self.out.range(start..start + len)
    }
}

/// `count · each`, or [`KernelError::TooLarge`] naming `what` when the product overflows.
fn checked_size(what: &'static str, count: usize, each: usize) -> Result<usize, KernelError> {
    count
        .checked_mul(each)
        .ok_or(KernelError::TooLarge { what, count, each })
}

fn check_len(what: &'static str, got: usize, expected: usize) -> Result<(), KernelError> {
    if got == expected {
        Ok(())
    } else {
        Err(KernelError::WrongLength {
            what,
            got,
            expected,
        })
    }
}

#[cfg(test)]
mod tests;
