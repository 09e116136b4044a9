//! AVX-512 VNNI and AVX2 kernels for panels ([`crate::panels`]): the arithmetic of
//! [`crate::panels::panel_dot`], with each row of a panel in a lane. VNNI machines hold all 16
//! rows in a 512-bit register and add four products per lane with one `vpdpbusd` (unsigned
//! quants times signed activations; a format's offset is taken off the block's total, from the
//! activations' sum); AVX2 takes the rows eight at a time, multiplies byte pairs into 16-bit
//! sums with `vpmaddubsw` and adds several of those in 16 bits before one `vpmaddwd` widens
//! them (times the sub-block's scale where there is one), exactly: see [`Rows::narrow_dot4`]
//! for how many fit. Q8_0's signed bytes go through `vpsignb` so that no pair saturates.
//! Tokens come in tiles (see `Tiling`): each chunk of weights is unpacked once per tile.

use std::arch::x86_64::*;
use std::ops::Range;

use crate::activations::QuantizedTokens;
use crate::panels::{
    chunk_at, panel_block_bytes, q4k, q5_0_highs_at, q6k, q6k_highs_at, small, PANEL_ROWS,
};
use crate::{Format, Isa, TaskOut};

mod ymm;
mod zmm;

use ymm::{Ymm, YmmPair};
use zmm::Zmm;

/// The instruction-set extensions `isa`'s kernels are compiled with (`target_feature` names):
/// what [`available`] checks. Each list is the one its kernel's `#[target_feature]` is made
/// from (`compiled_with!`), so the two cannot drift apart.
pub(crate) fn features(isa: Isa) -> &'static [&'static str] {
    match isa {
        Isa::Avx512Vnni => AVX512_VNNI,
        Isa::Avx2 => AVX2,
        Isa::Portable => &[],
    }
}

/// Whether this CPU and its OS support every extension `isa` is compiled with.
pub(crate) fn available(isa: Isa) -> bool {
    supported(isa, |feature| detected(feature) == Some(true))
}

/// Whether a CPU that has the extensions `has` says yes to can run `isa`.
fn supported(isa: Isa, has: impl Fn(&str) -> bool) -> bool {
    features(isa).iter().all(|feature| has(feature))
}

/// Whether this CPU and its OS support `feature` (for AVX and AVX-512 the OS must save their
/// registers, which the standard library checks too); `None` for a name it does not detect,
/// which [`available`] counts as missing (and a test rejects in a path's list).
fn detected(feature: &str) -> Option<bool> {
    Some(match feature {
        "avx" => is_x86_feature_detected!("avx"),
        "avx2" => is_x86_feature_detected!("avx2"),
        "fma" => is_x86_feature_detected!("fma"),
        "f16c" => is_x86_feature_detected!("f16c"),
        "avx512f" => is_x86_feature_detected!("avx512f"),
        "avx512bw" => is_x86_feature_detected!("avx512bw"),
        "avx512vl" => is_x86_feature_detected!("avx512vl"),
        "avx512vnni" => is_x86_feature_detected!("avx512vnni"),
        _ => return None,
    })
}

/// A kernel compiled with the extensions of a list, and that list as a constant: `$list =
/// ["avx2", "fma"]; unsafe fn f<P: Prefetch>(..) {..}` declares `const $list: &[&str]` and `f`
/// with `#[target_feature(enable = "avx2", enable = "fma")]`.
macro_rules! compiled_with {
    (
        $list:ident = [$($feature:tt),+ $(,)?];
        $(#[$attr:meta])*
        unsafe fn $name:ident<$param:ident: $bound:ident> $args:tt $body:block
    ) => {
        const $list: &[&str] = &[$($feature),+];
        $(#[$attr])*
        #[target_feature($(enable = $feature),+)]
        unsafe fn $name<$param: $bound> $args $body
    };
}

/// Row r · token t for the first `rows` rows of `panels` (whole panels of `blocks` blocks) and
/// the tokens of `acts`, into `out`'s row r of token t. The caller has checked that `isa` is
/// available.
pub(crate) fn panels_dot(
    isa: Isa,
    format: Format,
    panels: &[u8],
    rows: usize,
    acts: &QuantizedTokens,
    out: &TaskOut<'_>,
) {
    debug_assert!(isa.available());
    // Each kernel is compiled once per prefetch level, as a function of its own (inlined into
    // one, both levels' kernels took a frame that overflowed a thread's stack in debug builds).
    // SAFETY: the instruction set was checked by `QMatrix::matmul_with`; every load below stays
    // inside a panel block or the tokens' activations (whole blocks of 256).
    unsafe {
        match (isa, prefetch_into()) {
            (Isa::Avx512Vnni, PrefetchInto::L1) => {
                panels_vnni::<IntoL1>(format, panels, rows, acts, out);
            }
            (Isa::Avx512Vnni, PrefetchInto::L2) => {
                panels_vnni::<IntoL2>(format, panels, rows, acts, out);
            }
            (_, PrefetchInto::L1) => panels_avx2::<IntoL1>(format, panels, rows, acts, out),
            (_, PrefetchInto::L2) => panels_avx2::<IntoL2>(format, panels, rows, acts, out),
        }
    }
}

compiled_with! {
    // AVX-512 F, BW and VNNI for the 512-bit kernels, and the AVX2 list for the 256-bit loads
    // and shifts among them. VL adds no intrinsic; it lets the compiler encode 128- and 256-bit
    // instructions as EVEX, with all 32 registers.
    AVX512_VNNI = [
        "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512vnni",
    ];
    unsafe fn panels_vnni<P: Prefetch>(
        format: Format,
        panels: &[u8],
        rows: usize,
        acts: &QuantizedTokens,
        out: &TaskOut<'_>,
    ) {
        let tiling = Tiling::of(format, Isa::Avx512Vnni);
        let tiles = Tiles::new(format, rows, acts, out.tokens(), tiling);
        for (p, panel) in panels.chunks_exact(tiles.panel_bytes).enumerate() {
            tiles.panel::<Zmm, P>(panel, p, out);
        }
    }
}

compiled_with! {
    // F16C converts the f16 scales; FMA the float sums.
    AVX2 = ["avx", "avx2", "fma", "f16c"];
    unsafe fn panels_avx2<P: Prefetch>(
        format: Format,
        panels: &[u8],
        rows: usize,
        acts: &QuantizedTokens,
        out: &TaskOut<'_>,
    ) {
        let tiles = Tiles::new(format, rows, acts, out.tokens(), Tiling::of(format, Isa::Avx2));
        // Both halves of a panel one after the other, while it is in the cache: the weights
        // are read from memory once.
        for (p, panel) in panels.chunks_exact(tiles.panel_bytes).enumerate() {
            if tiles.tokens <= 4 || format != Format::Q5_0 {
                // Both halves in one pass, for every tile of tokens: the first tile streams the
                // weights from memory all the time (a second pass over a panel in the cache
                // left the memory idle for its duration), and the later tiles share each
                // load and unpacking of a chunk between both halves. With 2 threads on the
                // 8960 × 1536 matrix this took 24 % off 5 tokens and 12 % off 16 for Q4_K
                // against one pass per half, and as much for Q6_K, Q4_1 and Q8_0. Q5_0's fifth
                // bits take the registers that two halves of a tile's sums would need: its
                // batches beyond one tile go half by half (the single pass was 10–30 % slower).
                tiles.panel::<YmmPair, P>(panel, p, out);
            } else {
                tiles.panel::<Ymm<0>, P>(panel, p, out);
                tiles.panel::<Ymm<1>, P>(panel, p, out);
            }
        }
    }
}

/// How a product's tokens are split into tiles: each tile is one pass over a panel, whose chunks
/// are loaded and unpacked once for all of the tile's tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Tiling {
    /// Tiles of four and a last one of one to three.
    Fours,
    /// As few tiles of at most `max` tokens as the tokens need, their sizes differing by one
    /// at most.
    Even { max: usize },
}

impl Tiling {
    /// The tiling of `format`'s products on `isa`. Tiles of up to eight tokens share each
    /// chunk's unpacking among more tokens than tiles of four and a rest. On AVX2, one 8960 ×
    /// 1536 product with 2 threads took 5–20 % less time for 5–8 tokens in Q6_K and Q5_0, and
    /// (with one sum a token, below) 5–24 % less for 6–16 tokens in Q4_K, Q4_1 and Q4_0; Q8_0's
    /// were 3–15 % slower at 5, 8, 12 and 16 tokens in three of four runs (one sum a token did
    /// not help it). On a Zen 5 machine with AVX-512 VNNI, whole forwards of 5–16 tokens took
    /// 7–14 % less time with the Qwen 1.5B (Q4_K, Q6_K) and 5–12 % less with the 0.5B than
    /// with tiles of four everywhere; SmolLM2, a fifth of whose bytes are Q8_0, was 7–18 %
    /// slower at 8 and 16 tokens until Q8_0 kept its tiles of four there too.
    ///
    /// VNNI's 32 registers hold tiles of up to twelve: there, a second tile unpacks every
    /// panel again, and the 1.5B's forwards of 10–12 tokens took 10–15 % less time in one tile
    /// than in two (20–24 tokens, two tiles instead of three, 4–12 % less), the 0.5B's 3–13 %
    /// less at 10–16 tokens; tiles of sixteen made the 0.5B's 16-token forward 11 % slower (its
    /// Q5_0 and Q6_K keep two sums a token, which then no longer fit the registers), and
    /// sixteen for the formats of one sum a token only (Q4_K, Q4_0, Q4_1) took 3–7 % off the
    /// 1.5B's 14 and 16 tokens but made SmolLM2's 16 tokens 9 % slower. AVX2's sixteen
    /// registers keep tiles of eight.
    fn of(format: Format, isa: Isa) -> Self {
        match (format, isa) {
            (Format::Q8_0, _) => Tiling::Fours,
            (_, Isa::Avx512Vnni) => Tiling::Even { max: 12 },
            _ => Tiling::Even { max: 8 },
        }
    }

    /// Sizes of the tiles of `n` tokens, in order.
    fn sizes(self, n: usize) -> impl Iterator<Item = usize> {
        let tiles = match self {
            Tiling::Fours => n.div_ceil(4),
            Tiling::Even { max } => n.div_ceil(max),
        };
        (0..tiles).map(move |i| match self {
            Tiling::Fours => 4.min(n - 4 * i),
            Tiling::Even { .. } => n / tiles + usize::from(i < n % tiles),
        })
    }
}

/// The tiles of a product's tokens.
struct Tiles {
    format: Format,
    rows: usize,
    tokens: usize,
    blocks: usize,
    panel_bytes: usize,
    /// Taken from the thread's [`TILE_ROOM`] and given back on drop.
    tiles: Vec<Tile>,
}

thread_local! {
    /// Each thread's room for its tasks' tiles, reused from task to task instead of allocated
    /// and freed by every task of every matmul (why that matters: `Scratch` in lib.rs). A
    /// fixed array with room for a pass's most tiles was no better: filling and moving its
    /// 6 KiB in every task cost as much as the heap had.
    static TILE_ROOM: std::cell::Cell<Vec<Tile>> = const { std::cell::Cell::new(Vec::new()) };
}

impl Drop for Tiles {
    fn drop(&mut self) {
        TILE_ROOM.set(std::mem::take(&mut self.tiles));
    }
}

impl Tiles {
    fn new(
        format: Format,
        rows: usize,
        acts: &QuantizedTokens,
        tokens: usize,
        tiling: Tiling,
    ) -> Self {
        let blocks = acts.cols / format.block_len();
        let panel_bytes = blocks * panel_block_bytes(format);
        let mut tiles = TILE_ROOM.take();
        tiles.clear();
        let mut first = 0;
        for size in tiling.sizes(tokens) {
            let ahead = if first == 0 {
                PREFETCH_AHEAD
            } else {
                panel_bytes
            };
            tiles.push(Tile::new(acts, first, size, ahead));
            first += size;
        }
        Tiles {
            format,
            rows,
            tokens,
            blocks,
            panel_bytes,
            tiles,
        }
    }

    /// Panel `p`'s rows that `R` covers against every token.
    #[inline(always)]
    unsafe fn panel<R: Rows, P: Prefetch>(&self, panel: &[u8], p: usize, out: &TaskOut<'_>) {
        let (format, blocks) = (self.format, self.blocks);
        let first_row = p * PANEL_ROWS + R::FIRST_ROW;
        let here = self.rows.saturating_sub(first_row).min(R::LANES);
        if here == 0 {
            return;
        }
        for tile in &self.tiles {
            macro_rules! tile {
                ($($size:literal)|+) => {
                    match tile.size {
                        $($size => write::<R, $size>(
                            kernel::<R, P, $size>(format, panel, blocks, tile),
                            out,
                            first_row..first_row + here,
                            tile.first,
                        ),)+
                        _ => unreachable!("tiles hold one to twelve tokens"),
                    }
                };
            }
            // Tiles of nine to twelve come only from VNNI's tiling.
            tile!(1 | 2 | 3 | 4 | 5 | 6 | 7 | 8 | 9 | 10 | 11 | 12);
        }
    }
}

/// The wrapping sum of `words` (the memory probe): 256-bit loads into eight independent sums,
/// with `prefetch` lines asked for [`PREFETCH_AHEAD`] bytes ahead into the kernels' cache level
/// as the kernels ask for weights, else left to the hardware prefetcher. Which reads faster
/// depends on the machine: a plain loop kept fewer reads in flight than the kernels reached on
/// a Zen 5; on a Xeon with AMX, whose hardware prefetcher runs far ahead in huge pages, the
/// plain read took 33.5–37.6 GB/s and the prefetching one 28.0–28.9.
pub(crate) fn sum_words(words: &[u64], prefetch: bool) -> u64 {
    if is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was just detected.
        unsafe {
            match (prefetch, prefetch_into()) {
                (false, _) => sum_words_avx2::<HardwareOnly>(words),
                (true, PrefetchInto::L1) => sum_words_avx2::<IntoL1>(words),
                (true, PrefetchInto::L2) => sum_words_avx2::<IntoL2>(words),
            }
        }
    } else {
        words.iter().fold(0, |a, &x| a.wrapping_add(x))
    }
}

#[target_feature(enable = "avx2")]
unsafe fn sum_words_avx2<P: Prefetch>(words: &[u64]) -> u64 {
    const STEP: usize = 32;
    let mut sums = [_mm256_setzero_si256(); 8];
    let mut steps = words.chunks_exact(STEP);
    for step in &mut steps {
        let p = step.as_ptr() as *const u8;
        for line in 0..4 {
            prefetch_at::<P, 1>(p.add(64 * line), PREFETCH_AHEAD);
        }
        for (k, sum) in sums.iter_mut().enumerate() {
            *sum = _mm256_add_epi64(*sum, _mm256_loadu_si256(p.add(32 * k) as *const __m256i));
        }
    }
    let mut lanes = [0u64; 4];
    let mut total = 0u64;
    for sum in sums {
        _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, sum);
        total = lanes.iter().fold(total, |a, &x| a.wrapping_add(x));
    }
    steps
        .remainder()
        .iter()
        .fold(total, |a, &x| a.wrapping_add(x))
}

/// A tile's results (lane r = row `rows.start + r`) into `rows` of the tokens `first..`: each
/// token's rows are one contiguous run of the `[tokens, rows]` output.
#[inline(always)]
unsafe fn write<R: Rows, const TILE: usize>(
    results: [R::F; TILE],
    out: &TaskOut<'_>,
    rows: Range<usize>,
    first: usize,
) {
    for (t, result) in results.into_iter().enumerate() {
        // SAFETY: one run at a time, in the task's own rows.
        let run = out.rows_of(first + t, rows.start, rows.len());
        if run.len() == R::LANES {
            // A whole register's rows: stored in place (copying a short run through a buffer
            // called `memmove` for every token and panel).
            R::store(result, run);
        } else {
            let mut lanes = [0f32; PANEL_ROWS];
            R::store(result, &mut lanes[..R::LANES]);
            run.copy_from_slice(&lanes[..run.len()]);
        }
    }
}

#[inline(always)]
unsafe fn kernel<R: Rows, P: Prefetch, const TILE: usize>(
    format: Format,
    panel: &[u8],
    blocks: usize,
    tokens: &Tile,
) -> [R::F; TILE] {
    let tokens = &tokens.pointers::<TILE>();
    match format {
        Format::Q4K => q4k_kernel::<R, P, TILE>(panel, blocks, tokens),
        Format::Q6K => q6k_kernel::<R, P, TILE>(panel, blocks, tokens),
        Format::Q8_0 => q8_0_kernel::<R, P, TILE>(panel, blocks, tokens),
        // A constant format in each arm: inlined, each gets its own loop.
        Format::Q4_0 => nibbles_kernel::<R, P, TILE>(Format::Q4_0, panel, blocks, tokens),
        Format::Q4_1 => nibbles_kernel::<R, P, TILE>(Format::Q4_1, panel, blocks, tokens),
        Format::Q5_0 => nibbles_kernel::<R, P, TILE>(Format::Q5_0, panel, blocks, tokens),
    }
}

/// The most tokens a tile holds (VNNI's tiling).
const MAX_TILE: usize = 12;

/// A tile of tokens and pointers to their activations (the first `size` of each array), made
/// once per product rather than once per panel: with twelve tokens, making them for every
/// panel took 4 % of a whole forward's time.
struct Tile {
    first: usize,
    size: usize,
    /// How far ahead of a chunk its kernel prefetches: the first tile streams the panel from
    /// memory ([`PREFETCH_AHEAD`]); later ones, which find it in the cache, fetch the next
    /// panel (a panel's length ahead), so that memory is not idle while they run.
    ahead: usize,
    quants: [*const i8; MAX_TILE],
    scales: [*const f32; MAX_TILE],
    group_sums: [*const i16; MAX_TILE],
    q6k_offsets: [*const i32; MAX_TILE],
}

/// A tile's `TILE` tokens' pointers and prefetch distance, copied out of the [`Tile`] for one
/// kernel call, where they live in registers: read through a reference to the tile, they were
/// loaded again after every in-place prefetch.
struct TilePointers<const TILE: usize> {
    ahead: usize,
    quants: [*const i8; TILE],
    scales: [*const f32; TILE],
    group_sums: [*const i16; TILE],
    q6k_offsets: [*const i32; TILE],
}

impl Tile {
    #[inline(always)]
    fn pointers<const TILE: usize>(&self) -> TilePointers<TILE> {
        TilePointers {
            ahead: self.ahead,
            quants: std::array::from_fn(|t| self.quants[t]),
            scales: std::array::from_fn(|t| self.scales[t]),
            group_sums: std::array::from_fn(|t| self.group_sums[t]),
            q6k_offsets: std::array::from_fn(|t| self.q6k_offsets[t]),
        }
    }

    fn new(acts: &QuantizedTokens, first: usize, size: usize, ahead: usize) -> Self {
        assert!(size <= MAX_TILE, "a tile of {size} tokens");
        let token = |t: usize| first + t.min(size - 1);
        Self {
            first,
            size,
            ahead,
            quants: std::array::from_fn(|t| acts.quants_of(token(t)).as_ptr()),
            scales: std::array::from_fn(|t| acts.scales_of(token(t)).as_ptr()),
            group_sums: std::array::from_fn(|t| acts.group_sums_of(token(t)).as_ptr()),
            q6k_offsets: std::array::from_fn(|t| match acts.block {
                256 => acts.q6k_offsets_of(token(t)).as_ptr(),
                _ => std::ptr::null(),
            }),
        }
    }
}

/// How far ahead of the chunk being multiplied the kernels ask for weights. Products with few
/// tokens are bound by how many reads are in flight, and the hardware prefetcher alone keeps
/// too few: with 4 KiB and two `vpdpbusd` chains per sum instead of one, a one-token Q4_K
/// product of 8960 × 1536 from memory went from 36 to 64 GB/s (2 threads, one A/B run).
///
/// The faster memory reads, the more bytes must be on their way (bandwidth × latency). On a
/// Zen 5 machine whose memory read 80–86 GB/s at times and 50–53 at others, the distances
/// alternated within one process (that product cycled through 1 GiB, 2 threads): at the fast
/// times Q4_K read 66.5 GB/s at 4 KiB, 68.2 at 5 KiB, 69.2 at 6 KiB, 69.0 at 8 KiB and 64.5 at
/// 12 KiB (Q6_K 70.2 at 4 KiB, 73.2 at 6 KiB); at the slow ones 50.3 at 4 KiB and 49.4 at
/// 6 KiB. Prefetching into L2 instead (`T1`, 4–16 KiB), or into L1 and L2 at two distances,
/// was slower at both speeds there, but not on Intel's cores ([`prefetch_into_for`]), where
/// `T1` read as fast at 4, 6 and 8 KiB.
const PREFETCH_AHEAD: usize = 6144;

/// The cache level the kernels' prefetches fill.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PrefetchInto {
    /// `prefetcht0`: L1 and the levels below it.
    L1,
    /// `prefetcht1`: L2 and the levels below it.
    L2,
}

/// Where this machine's kernels prefetch into: `SPECVOICE_PREFETCH` (`l1` or `l2`) when set to
/// one of those, else by the CPU's maker (decided once).
fn prefetch_into() -> PrefetchInto {
    static INTO: std::sync::OnceLock<PrefetchInto> = std::sync::OnceLock::new();
    *INTO.get_or_init(|| {
        let chosen = std::env::var("SPECVOICE_PREFETCH").ok();
        prefetch_into_for(chosen.as_deref(), &cpu_vendor())
    })
}

/// The prefetch level for a `SPECVOICE_PREFETCH` value (anything but `l1` or `l2` is ignored)
/// and a CPU vendor string. Intel's cores fill more lines at once into L2 than into L1: on a
/// Xeon with AVX-512 and AMX (2 cores of a KVM guest), a one-token product of 8960 × 1536
/// cycled from memory read 27.8–29.7 GB/s (Q4_K) and 29.5–30.7 (Q6_K) with `prefetcht1`,
/// against 25.9–26.3 and 28.1–29.2 with `prefetcht0` (6 KiB ahead, three rounds alternated),
/// and the 1.5B's one-token forward took 34.4–35.8 ms against 39.3–39.9. On a
/// Zen 5 machine prefetching into L2 was slower at every distance tried, so other CPUs keep L1.
fn prefetch_into_for(chosen: Option<&str>, vendor: &[u8; 12]) -> PrefetchInto {
    match chosen {
        Some("l1") => PrefetchInto::L1,
        Some("l2") => PrefetchInto::L2,
        _ if vendor == b"GenuineIntel" => PrefetchInto::L2,
        _ => PrefetchInto::L1,
    }
}

/// The CPU's vendor string (`GenuineIntel`, `AuthenticAMD`, ...).
fn cpu_vendor() -> [u8; 12] {
    let id = __cpuid(0);
    let mut vendor = [0u8; 12];
    for (part, word) in vendor.chunks_exact_mut(4).zip([id.ebx, id.edx, id.ecx]) {
        part.copy_from_slice(&word.to_le_bytes());
    }
    vendor
}

/// A cache level to prefetch into, as a type: the kernels are compiled once per level, and
/// the level is chosen before they start. Chosen inside the loops (a branch at every prefetch),
/// it let the compiler gather a group's prefetches into one burst ahead of their loads, and a
/// C loop of the kernels' shape read 16 % slower from memory with its prefetches batched that
/// way. On the Xeon with AMX, typed levels made one-token products of 8960 × 1536 from memory
/// 0–5 % faster in Q4_K and 7–15 % in Q6_K, 3–7 % slower in Q8_0 (2 threads, binaries
/// alternated three times), and one-token forwards after 128 cached tokens 7–9 % shorter for
/// the Qwen 1.5B, 2–5 % for the 0.5B and 1–8 % for SmolLM2. The price: the kernels compile
/// twice (a release build of this crate took about a minute longer).
trait Prefetch {
    /// Asks for the cache line at `line`, at this point of the instruction stream.
    unsafe fn in_place(line: *const i8);

    /// Asks for the cache line at `line`, wherever the compiler schedules it.
    unsafe fn scheduled(line: *const i8);
}

/// `prefetcht0`.
struct IntoL1;

/// `prefetcht1`.
struct IntoL2;

/// No software prefetch: the hardware prefetcher alone (the memory probe's plain read).
struct HardwareOnly;

// The in-place prefetches are `asm!` blocks, which the compiler neither moves nor moves loads
// across; the scheduled ones are the intrinsic, which it moves freely.
impl Prefetch for IntoL1 {
    #[inline(always)]
    unsafe fn in_place(line: *const i8) {
        std::arch::asm!(
            "prefetcht0 [{line}]",
            line = in(reg) line,
            options(nostack, preserves_flags, readonly)
        );
    }

    #[inline(always)]
    unsafe fn scheduled(line: *const i8) {
        _mm_prefetch::<_MM_HINT_T0>(line);
    }
}

impl Prefetch for IntoL2 {
    #[inline(always)]
    unsafe fn in_place(line: *const i8) {
        std::arch::asm!(
            "prefetcht1 [{line}]",
            line = in(reg) line,
            options(nostack, preserves_flags, readonly)
        );
    }

    #[inline(always)]
    unsafe fn scheduled(line: *const i8) {
        _mm_prefetch::<_MM_HINT_T1>(line);
    }
}

impl Prefetch for HardwareOnly {
    #[inline(always)]
    unsafe fn in_place(_: *const i8) {}

    #[inline(always)]
    unsafe fn scheduled(_: *const i8) {}
}

/// The largest tiles whose prefetches stay in place. LLVM unrolls a kernel's chunks and puts
/// the prefetch of a chunk after that chunk's load and the next chunk's prefetch beside it:
/// prefetches in pairs. Tiles of a few tokens are bound by the reads from memory, and pairs
/// cost them: a one-token Q4_K loop of the kernel's shape read 15.0–15.6 GB/s on one thread
/// with the intrinsic and 16.4–17.0 with each prefetch in place before its chunk's load, as a
/// C loop compiled by GCC reads. Larger tiles are bound by their arithmetic, which the
/// compiler schedules better with the prefetches free to move: 16-token forwards of the Qwen
/// 1.5B (two tiles of eight) took 6 % longer with them in place.
const IN_PLACE_TILE: usize = 4;

/// Asks for the cache line `ahead` bytes after `chunk` (past the end of the weights it is a
/// no-op: a prefetch never faults, and the address is only computed, not dereferenced), from
/// a kernel of `TILE` tokens.
#[inline(always)]
unsafe fn prefetch_at<P: Prefetch, const TILE: usize>(chunk: *const u8, ahead: usize) {
    let line = chunk.wrapping_add(ahead) as *const i8;
    if TILE <= IN_PLACE_TILE {
        P::in_place(line);
    } else {
        P::scheduled(line);
    }
}

/// Asks for the lines of the panel block at `block` that hold no chunk's first byte (scales,
/// minimums, fifth bits), `ahead` bytes on: the kernels prefetch each chunk as they reach it,
/// and without these a tenth of a Q4_K block's lines (5 of 37) was left to the hardware
/// prefetcher. A one-token Q4_K product of 8960 × 1536 cycled from memory read 48 GB/s
/// against 46 without them, while the memory probe read 52 (2 threads, binaries alternated).
#[inline(always)]
unsafe fn prefetch_fields<P: Prefetch, const TILE: usize>(
    format: Format,
    block: *const u8,
    ahead: usize,
) {
    for line in (0..chunk_at(format, 0)).step_by(64) {
        prefetch_at::<P, TILE>(block.add(line), ahead);
    }
    if format == Format::Q6K {
        // Its scales d close the block; its high bit pairs lie between the chunks.
        prefetch_at::<P, TILE>(block.add(q6k::D), ahead);
    }
}

#[inline(always)]
unsafe fn q4k_kernel<R: Rows, P: Prefetch, const TILE: usize>(
    panel: &[u8],
    blocks: usize,
    tokens: &TilePointers<TILE>,
) -> [R::F; TILE] {
    let mut acc = [R::zero_f(); TILE];
    for b in 0..blocks {
        let p = panel.as_ptr().add(b * q4k::BYTES);
        prefetch_fields::<P, TILE>(Format::Q4K, p, tokens.ahead);
        let pairs: [R::I; 4] = std::array::from_fn(|i| R::u8_pairs(p.add(q4k::MINS + 32 * i)));
        let (d, dmin) = (R::f16s(p.add(q4k::D)), R::f16s(p.add(q4k::DMIN)));
        let mut total = [R::zero_i(); TILE];
        for j in 0..8 {
            // Low and high nibbles add into separate sums: two dependency chains instead of
            // one twice as long (integer sums: the same total either way). Each holds four
            // chunks' products of nibbles, and both together eight: within what a narrow sum
            // holds.
            let mut sub = [R::zero_i(); TILE];
            let mut sub_high = [R::zero_i(); TILE];
            for chunk in 4 * j..4 * j + 4 {
                prefetch_at::<P, TILE>(p.add(chunk_at(Format::Q4K, chunk)), tokens.ahead);
                let (low, high) = R::nibbles(p.add(chunk_at(Format::Q4K, chunk)));
                for t in 0..TILE {
                    let a = tokens.quants[t].add(256 * b + 8 * chunk);
                    sub[t] = R::narrow_dot4(sub[t], low, a);
                    if TILE > 4 {
                        // Enough tokens for independent chains: one sum a token leaves the
                        // registers to the tile.
                        sub[t] = R::narrow_dot4(sub[t], high, a.add(4));
                    } else {
                        sub_high[t] = R::narrow_dot4(sub_high[t], high, a.add(4));
                    }
                }
            }
            let scale = R::u8_scales(p.add(q4k::SCALES + 16 * j));
            for t in 0..TILE {
                total[t] = R::widen_scaled(total[t], R::narrow_add(sub[t], sub_high[t]), scale);
            }
        }
        for (t, acc) in acc.iter_mut().enumerate() {
            let groups = tokens.group_sums[t].add(8 * b);
            let mut mins = R::zero_i();
            for (i, &pairs) in pairs.iter().enumerate() {
                mins = R::pair_dot(mins, pairs, groups.add(2 * i));
            }
            let da = *tokens.scales[t].add(b);
            *acc = R::fma_scaled(*acc, total[t], d, da);
            *acc = R::fnma_scaled(*acc, mins, dmin, da);
        }
    }
    acc
}

#[inline(always)]
unsafe fn q6k_kernel<R: Rows, P: Prefetch, const TILE: usize>(
    panel: &[u8],
    blocks: usize,
    tokens: &TilePointers<TILE>,
) -> [R::F; TILE] {
    let mut acc = [R::zero_f(); TILE];
    for b in 0..blocks {
        let p = panel.as_ptr().add(b * q6k::BYTES);
        prefetch_fields::<P, TILE>(Format::Q6K, p, tokens.ahead);
        let mut total = [R::zero_i(); TILE];
        for j in 0..16 {
            // Two chunks' products of 6-bit quants in each narrow sum, the most AVX2's holds:
            // the low and high halves are widened separately there. VNNI's 32-bit sums hold
            // all four, and with enough tokens for independent chains one sum a token leaves
            // the registers to the tile (tiles of twelve kept 36 sums and spilled).
            let mut sub = [R::zero_i(); TILE];
            let mut sub_high = [R::zero_i(); TILE];
            for chunk in 2 * j..2 * j + 2 {
                prefetch_at::<P, TILE>(p.add(chunk_at(Format::Q6K, chunk)), tokens.ahead);
                let (low, high) = R::nibbles(p.add(chunk_at(Format::Q6K, chunk)));
                let (low_top, high_top) = R::q6k_high_bits(p.add(q6k_highs_at(chunk)));
                let (low, high) = (R::or(low, low_top), R::or(high, high_top));
                for t in 0..TILE {
                    let a = tokens.quants[t].add(256 * b + 8 * chunk);
                    sub[t] = R::narrow_dot4(sub[t], low, a);
                    if R::WIDE_NARROW && TILE > 4 {
                        sub[t] = R::narrow_dot4(sub[t], high, a.add(4));
                    } else {
                        sub_high[t] = R::narrow_dot4(sub_high[t], high, a.add(4));
                    }
                }
            }
            prefetch_at::<P, TILE>(p.add(q6k_highs_at(2 * j)), tokens.ahead);
            let scale = R::i8_scales(p.add(q6k::SCALES + 16 * j));
            for t in 0..TILE {
                let offset = *tokens.q6k_offsets[t].add(16 * b + j);
                total[t] = R::q6k_widen_scaled(total[t], sub[t], sub_high[t], offset, scale);
            }
        }
        let d = R::f16s(p.add(q6k::D));
        for (t, acc) in acc.iter_mut().enumerate() {
            *acc = R::fma_scaled(*acc, total[t], d, *tokens.scales[t].add(b));
        }
    }
    acc
}

/// Q4_0, Q4_1 and Q5_0.
#[inline(always)]
unsafe fn nibbles_kernel<R: Rows, P: Prefetch, const TILE: usize>(
    format: Format,
    panel: &[u8],
    blocks: usize,
    tokens: &TilePointers<TILE>,
) -> [R::F; TILE] {
    // The stored quants are q; Q4_0's weights are q − 8, Q5_0's q − 16.
    let offset = match format {
        Format::Q4_0 => -8,
        Format::Q5_0 => -16,
        _ => 0,
    };
    let bytes = panel_block_bytes(format);
    let mut acc = [R::zero_f(); TILE];
    for b in 0..blocks {
        let p = panel.as_ptr().add(b * bytes);
        prefetch_fields::<P, TILE>(format, p, tokens.ahead);
        let mut total: [R::I; TILE] =
            std::array::from_fn(|t| R::splat(offset * *tokens.group_sums[t].add(b) as i32));
        let mut sub = [R::zero_i(); TILE];
        let mut sub_high = [R::zero_i(); TILE];
        for chunk in 0..4 {
            prefetch_at::<P, TILE>(p.add(chunk_at(format, chunk)), tokens.ahead);
            let (mut low, mut high) = R::nibbles(p.add(chunk_at(format, chunk)));
            if format == Format::Q5_0 {
                let (low_top, high_top) = R::q5_0_high_bits(p.add(q5_0_highs_at(chunk)));
                (low, high) = (R::or(low, low_top), R::or(high, high_top));
            }
            for t in 0..TILE {
                let a = tokens.quants[t].add(32 * b + 8 * chunk);
                sub[t] = R::narrow_dot4(sub[t], low, a);
                if TILE > 4 && format != Format::Q5_0 {
                    // As in the Q4_K kernel: one sum a token in a wide tile.
                    sub[t] = R::narrow_dot4(sub[t], high, a.add(4));
                } else {
                    sub_high[t] = R::narrow_dot4(sub_high[t], high, a.add(4));
                }
            }
        }
        for t in 0..TILE {
            // Four chunks' products in each narrow sum; eight of 4-bit quants fit in one, but
            // Q5_0's 5-bit ones only four, so its halves are widened separately.
            total[t] = if format == Format::Q5_0 {
                R::widen(R::widen(total[t], sub[t]), sub_high[t])
            } else {
                R::widen(total[t], R::narrow_add(sub[t], sub_high[t]))
            };
        }
        let d = R::f16s(p.add(small::D));
        let mins = (format == Format::Q4_1).then(|| R::f16s(p.add(small::Q4_1_MINS)));
        for (t, acc) in acc.iter_mut().enumerate() {
            let da = *tokens.scales[t].add(b);
            *acc = R::fma_scaled(*acc, total[t], d, da);
            if let Some(mins) = mins {
                let sum = *tokens.group_sums[t].add(b) as f32;
                *acc = R::fma_splat(*acc, mins, da * sum);
            }
        }
    }
    acc
}

#[inline(always)]
unsafe fn q8_0_kernel<R: Rows, P: Prefetch, const TILE: usize>(
    panel: &[u8],
    blocks: usize,
    tokens: &TilePointers<TILE>,
) -> [R::F; TILE] {
    let mut acc = [R::zero_f(); TILE];
    for b in 0..blocks {
        let p = panel.as_ptr().add(b * panel_block_bytes(Format::Q8_0));
        prefetch_fields::<P, TILE>(Format::Q8_0, p, tokens.ahead);
        let mut total: [R::I; TILE] =
            std::array::from_fn(|t| R::splat(-R::Q8_0_BIAS * *tokens.group_sums[t].add(b) as i32));
        let mut total_odd = [R::zero_i(); TILE];
        for chunk in 0..8 {
            prefetch_at::<P, TILE>(p.add(chunk_at(Format::Q8_0, chunk)), tokens.ahead);
            let weights = R::bytes(p.add(chunk_at(Format::Q8_0, chunk)));
            let sums = if chunk % 2 == 0 {
                &mut total
            } else {
                &mut total_odd
            };
            for (t, sum) in sums.iter_mut().enumerate() {
                *sum = R::q8_0_dot4(*sum, weights, tokens.quants[t].add(32 * b + 4 * chunk));
            }
        }
        for t in 0..TILE {
            total[t] = R::add(total[t], total_odd[t]);
        }
        let d = R::f16s(p.add(small::D));
        for (t, acc) in acc.iter_mut().enumerate() {
            *acc = R::fma_scaled(*acc, total[t], d, *tokens.scales[t].add(b));
        }
    }
    acc
}

/// The rows of a panel one register covers, and the operations the kernels need on them.
/// Pointers are to the panel-wide arrays (16 rows); each implementation takes its rows.
trait Rows {
    /// 32-bit integer lanes, one per row.
    type I: Copy;
    /// f32 lanes, one per row.
    type F: Copy;
    const LANES: usize;
    const FIRST_ROW: usize;
    /// What [`Rows::q8_0_dot4`] adds to each product beyond w · a, times a: the block's total
    /// starts at −bias · Σa.
    const Q8_0_BIAS: i32;
    /// Whether a narrow sum ([`Rows::narrow_dot4`]) is the 32-bit sum itself, which holds every
    /// product of a block.
    const WIDE_NARROW: bool;
    unsafe fn zero_i() -> Self::I;
    unsafe fn zero_f() -> Self::F;
    unsafe fn splat(x: i32) -> Self::I;
    unsafe fn or(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn add(a: Self::I, b: Self::I) -> Self::I;
    /// A chunk's quants: columns 0–3 (low nibbles) and 4–7 (high nibbles), four bytes a row.
    unsafe fn nibbles(chunk: *const u8) -> (Self::I, Self::I);
    /// A chunk's 64 bytes (Q8_0), four bytes a row.
    unsafe fn bytes(chunk: *const u8) -> Self::I;
    /// `acc` + in each lane Σ (w + 128 − bias) · a over its four Q8_0 bytes (stored w + 128).
    unsafe fn q8_0_dot4(acc: Self::I, w: Self::I, a: *const i8) -> Self::I;
    /// Q5_0's fifth bits of a chunk, in place (bit 4) to be or-ed onto its nibbles.
    unsafe fn q5_0_high_bits(masks: *const u8) -> (Self::I, Self::I);
    /// Q6_K's high bit pairs of a chunk, in place (bits 4–5) to be or-ed onto its nibbles.
    unsafe fn q6k_high_bits(highs: *const u8) -> (Self::I, Self::I);
    /// A narrow sum `acc` + in each lane the four unsigned bytes of `u` times the four signed
    /// bytes at `a`. On AVX2 a narrow lane is two 16-bit sums of byte-pair products (a pair
    /// of quants ≤ q times activations ≤ 127 in magnitude adds at most 254·q), so one holds
    /// ⌊32767 / (254·q)⌋ products: eight of 4-bit quants, four of 5-bit, two of 6-bit. With
    /// VNNI it is the 32-bit sum itself.
    unsafe fn narrow_dot4(acc: Self::I, u: Self::I, a: *const i8) -> Self::I;
    /// Two narrow sums added (within what one holds).
    unsafe fn narrow_add(a: Self::I, b: Self::I) -> Self::I;
    /// `total` + the narrow sum `narrow` in 32 bits.
    unsafe fn widen(total: Self::I, narrow: Self::I) -> Self::I;
    /// `total` + the narrow sum `narrow` times each row's scale from [`Rows::u8_scales`] or
    /// [`Rows::i8_scales`].
    unsafe fn widen_scaled(total: Self::I, narrow: Self::I, scale: Self::I) -> Self::I;
    /// `total` + (`low` + `high` + `offset`) times each row's scale: a Q6_K sub-block, its
    /// two narrow sums full (each widened on its own on AVX2) and `offset` its −32 · Σa over
    /// 16 activations (even, of magnitude ≤ 65024).
    unsafe fn q6k_widen_scaled(
        total: Self::I,
        low: Self::I,
        high: Self::I,
        offset: i32,
        scale: Self::I,
    ) -> Self::I;
    /// Unsigned bytes, one scale per row.
    unsafe fn u8_scales(p: *const u8) -> Self::I;
    /// Signed bytes, one scale per row.
    unsafe fn i8_scales(p: *const u8) -> Self::I;
    /// Unsigned byte pairs, one pair per row, as 16-bit halves.
    unsafe fn u8_pairs(p: *const u8) -> Self::I;
    /// `acc` + each lane's 16-bit pair times the two i16 at `g`.
    unsafe fn pair_dot(acc: Self::I, pairs: Self::I, g: *const i16) -> Self::I;
    /// f16 values, one per row.
    unsafe fn f16s(p: *const u8) -> Self::F;
    /// `fma(total, d · da, acc)`.
    unsafe fn fma_scaled(acc: Self::F, total: Self::I, d: Self::F, da: f32) -> Self::F;
    /// `fma(m, x, acc)`.
    unsafe fn fma_splat(acc: Self::F, m: Self::F, x: f32) -> Self::F;
    /// `fma(−x, d · da, acc)`.
    unsafe fn fnma_scaled(acc: Self::F, x: Self::I, d: Self::F, da: f32) -> Self::F;
    /// The lanes into `out`, which holds `LANES` values.
    unsafe fn store(x: Self::F, out: &mut [f32]);
}

#[cfg(test)]
mod tests;
