//! The micro-kernels of row-by-row attention: dot products of queries and keys, and rows of
//! weights times a matrix of values (or of transposed keys), with AVX / AVX-512 paths chosen
//! at run time that give the bits of the portable ones. Every sum runs in a fixed order, so a
//! row's result does not depend on the rows computed beside it: verifying a block of tokens
//! gives each the attention of decoding it alone (`spec-nn`'s attention layers build on this).

/// The dot products of `PAIRS` (query, key) pairs: per pair, eight accumulation lanes over
/// the dimensions in order ([`pair_lanes`]), then the lanes summed as a fixed tree (halves,
/// quarters, pair) and the tail added. A pair's sum does not depend on the pairs beside it;
/// taking several together only interleaves their chains, so the additions overlap instead of
/// waiting for each other.
#[inline(always)]
fn pair_dots<const PAIRS: usize>(pairs: [(&[f32], &[f32]); PAIRS]) -> [f32; PAIRS] {
    let dim = pairs[0].0.len();
    assert!(pairs.iter().all(|(q, k)| q.len() == dim && k.len() == dim));
    let whole = dim - dim % 8;
    let lanes = pair_lanes(&pairs, whole);
    let mut out = [0f32; PAIRS];
    for ((out, l), (query, key)) in out.iter_mut().zip(&lanes).zip(&pairs) {
        let tail: f32 = query[whole..]
            .iter()
            .zip(&key[whole..])
            .map(|(x, y)| x * y)
            .sum();
        let halves = [l[0] + l[4], l[1] + l[5], l[2] + l[6], l[3] + l[7]];
        let quarters = [halves[0] + halves[2], halves[1] + halves[3]];
        *out = (quarters[0] + quarters[1]) + tail;
    }
    out
}

/// Per pair, `lanes[l] = Σ_c query[8c + l] · key[8c + l]` over the `whole / 8` chunks in order
/// (a product, then a sum: never fused). With AVX a pair's lanes are one register, so every
/// pair's chain stays in registers however many there are; without it the same arithmetic in
/// plain Rust.
#[inline(always)]
fn pair_lanes<const PAIRS: usize>(
    pairs: &[(&[f32], &[f32]); PAIRS],
    whole: usize,
) -> [[f32; 8]; PAIRS] {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: AVX was just detected; `pair_dots` checked that every slice holds `whole`.
        return unsafe { avx::pair_lanes(pairs, whole) };
    }
    portable_pair_lanes(pairs, whole)
}

/// [`pair_lanes`] in plain Rust.
#[inline(always)]
fn portable_pair_lanes<const PAIRS: usize>(
    pairs: &[(&[f32], &[f32]); PAIRS],
    whole: usize,
) -> [[f32; 8]; PAIRS] {
    let mut lanes = [[0f32; 8]; PAIRS];
    for start in (0..whole).step_by(8) {
        for (lanes, (query, key)) in lanes.iter_mut().zip(pairs) {
            let q = &query[start..start + 8];
            let k = &key[start..start + 8];
            for l in 0..8 {
                lanes[l] += q[l] * k[l];
            }
        }
    }
    lanes
}

#[cfg(target_arch = "x86_64")]
mod avx {
    use std::arch::x86_64::*;

    /// [`super::pair_lanes`] on 256-bit registers.
    ///
    /// # Safety
    /// The CPU must have AVX, and every slice must hold at least `whole` values.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn pair_lanes<const PAIRS: usize>(
        pairs: &[(&[f32], &[f32]); PAIRS],
        whole: usize,
    ) -> [[f32; 8]; PAIRS] {
        let mut sums = [_mm256_setzero_ps(); PAIRS];
        for start in (0..whole).step_by(8) {
            for (sum, (query, key)) in sums.iter_mut().zip(pairs) {
                let q = _mm256_loadu_ps(query.as_ptr().add(start));
                let k = _mm256_loadu_ps(key.as_ptr().add(start));
                *sum = _mm256_add_ps(*sum, _mm256_mul_ps(q, k));
            }
        }
        let mut lanes = [[0f32; 8]; PAIRS];
        for (lanes, sum) in lanes.iter_mut().zip(sums) {
            _mm256_storeu_ps(lanes.as_mut_ptr(), sum);
        }
        lanes
    }
}

/// Bytes of keys or values ahead of the one being read that the attention loops ask the
/// caches for. A decoding step reads its layer's cached keys and values once, from memory
/// (the layers' weights read between two steps have evicted them), at a few bytes of
/// arithmetic per byte: without these requests a thread waited for each row in turn. The
/// portable weighted-value loop (machines without AVX-512) asks too: forced in place of the
/// AVX-512 loop on a Xeon, it made SmolLM2's one-token forward after 320 cached tokens 8–13 %
/// shorter (3.77–4.09 → 3.50–3.56 ms, as fast as the AVX-512 loop; alternated three times).
const PREFETCH_AHEAD_BYTES: usize = 4096;

/// Rows that [`PREFETCH_AHEAD_BYTES`] holds for rows of `len` values (at least one).
#[inline]
fn rows_ahead(len: usize) -> usize {
    (PREFETCH_AHEAD_BYTES / (4 * len).max(1)).max(1)
}

/// Asks the caches for the lines of `values` (a hint: it changes no result).
#[inline(always)]
fn prefetch(values: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    for line in (0..values.len()).step_by(16) {
        // SAFETY: a prefetch of an address inside the slice; it never faults.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                values.as_ptr().add(line).cast(),
            );
        };
    }
}

/// `scores[r·keys + j]` = query `r` · key `j` for every key `0..keys`, by `pair_dots` over
/// groups of `KEYS` keys (`PAIRS` = rows · `KEYS` ≤ 8 chains in registers), then key by key.
/// Each dot product is summed in eight lanes in the order of the dimensions, then the lanes in
/// a fixed tree, so a pair's score has the same bits whatever pairs are computed beside it.
pub fn block_scores<'k, const KEYS: usize, const PAIRS: usize>(
    queries: &[&[f32]],
    key: impl Fn(usize) -> &'k [f32],
    keys: usize,
    scores: &mut [f32],
) {
    let rows = queries.len();
    assert_eq!(rows * KEYS, PAIRS, "{rows} rows of {KEYS} keys");
    let ahead = rows_ahead(queries[0].len());
    let mut first = 0;
    while first + KEYS <= keys {
        for j in first + ahead..(first + ahead + KEYS).min(keys) {
            prefetch(key(j));
        }
        let pairs: [(&[f32], &[f32]); PAIRS] =
            std::array::from_fn(|p| (queries[p / KEYS], key(first + p % KEYS)));
        for (p, dot) in pair_dots(pairs).into_iter().enumerate() {
            scores[(p / KEYS) * keys + first + p % KEYS] = dot;
        }
        first += KEYS;
    }
    for j in first..keys {
        for (r, query) in queries.iter().enumerate() {
            scores[r * keys + j] = pair_dots([(*query, key(j))])[0];
        }
    }
}

/// Each row's sum of its softmax weights (`weights` holds the rows, `keys` each), in key order:
/// a masked key's weight of 0 adds exactly nothing wherever it lies, so a token tree's branch
/// (whose siblings are masked keys in the middle of its row) sums as decoding it alone does.
/// The rows' chains are interleaved, so their additions overlap.
#[inline]
pub fn weight_sums(weights: &[f32], keys: usize, sums: &mut [f32]) {
    sums.fill(0.0);
    for key in 0..keys {
        for (r, sum) in sums.iter_mut().enumerate() {
            *sum += weights[r * keys + key];
        }
    }
}

/// The narrow column group of [`rows_times_matrix`] (one vector), for the columns past its wide
/// groups.
const LANES: usize = 16;

/// `out[r·width + c] = Σ_i coefficients[r][i] · matrix_row(i)[c]` for up to
/// [`MAX_PRODUCT_ROWS`] rows, each sum accumulated from zero in the order of i, so a row's
/// result is bit-identical whatever rows are beside it and however the columns are grouped.
/// The rows go together through groups of columns whose sums stay in registers (with AVX-512
/// all rows at once, 64 columns for up to 4 rows and 32 for more; else 4 rows at a time, 64
/// columns), then groups of 16 (`LANES`), then single columns: each row of the matrix is read
/// once for the rows of a pass, and a group's columns are independent chains, so the
/// additions of consecutive terms overlap instead of waiting for each other (one chain of 16
/// lanes per row was bound by the latency of an addition).
pub fn rows_times_matrix<'m>(
    coefficients: &[&[f32]],
    matrix_row: impl Fn(usize) -> &'m [f32] + Copy,
    width: usize,
    out: &mut [f32],
) {
    match coefficients.len() {
        0 => {}
        1 => rows_product::<1>(coefficients, matrix_row, width, out),
        2 => rows_product::<2>(coefficients, matrix_row, width, out),
        3 => rows_product::<3>(coefficients, matrix_row, width, out),
        4 => rows_product::<4>(coefficients, matrix_row, width, out),
        5 => rows_product::<5>(coefficients, matrix_row, width, out),
        6 => rows_product::<6>(coefficients, matrix_row, width, out),
        7 => rows_product::<7>(coefficients, matrix_row, width, out),
        MAX_PRODUCT_ROWS => rows_product::<MAX_PRODUCT_ROWS>(coefficients, matrix_row, width, out),
        rows => panic!("{rows} rows in one product, at most {MAX_PRODUCT_ROWS}"),
    }
}

/// Most rows of one [`rows_times_matrix`].
pub const MAX_PRODUCT_ROWS: usize = 8;

/// Rows that go through the plain loop's column groups together: their sums fill the
/// registers.
const PLAIN_ROWS: usize = 4;

/// The wide column group of the plain loop: four vectors of 16 lanes per row.
const WIDE_COLUMNS: usize = 64;

/// [`rows_times_matrix`] for `ROWS` rows: on 512-bit registers where the CPU has them, else
/// in plain Rust.
fn rows_product<'m, const ROWS: usize>(
    coefficients: &[&[f32]],
    matrix_row: impl Fn(usize) -> &'m [f32] + Copy,
    width: usize,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F was just detected.
        unsafe {
            if ROWS <= PLAIN_ROWS {
                avx512::columns_in_groups::<ROWS, 4>(coefficients, matrix_row, width, out);
            } else {
                avx512::columns_in_groups::<ROWS, 2>(coefficients, matrix_row, width, out);
            }
        }
        return;
    }
    plain_rows_product(coefficients, matrix_row, width, out);
}

/// [`rows_times_matrix`] in plain Rust, in passes of up to [`PLAIN_ROWS`] rows.
fn plain_rows_product<'m>(
    coefficients: &[&[f32]],
    matrix_row: impl Fn(usize) -> &'m [f32] + Copy,
    width: usize,
    out: &mut [f32],
) {
    for (pass, rows) in coefficients.chunks(PLAIN_ROWS).enumerate() {
        let out = &mut out[pass * PLAIN_ROWS * width..];
        match rows.len() {
            1 => columns_in_groups::<1>(rows, matrix_row, width, out),
            2 => columns_in_groups::<2>(rows, matrix_row, width, out),
            3 => columns_in_groups::<3>(rows, matrix_row, width, out),
            _ => columns_in_groups::<PLAIN_ROWS>(rows, matrix_row, width, out),
        }
    }
}

/// The plain loop of [`rows_times_matrix`] for `ROWS` rows.
fn columns_in_groups<'m, const ROWS: usize>(
    coefficients: &[&[f32]],
    matrix_row: impl Fn(usize) -> &'m [f32] + Copy,
    width: usize,
    out: &mut [f32],
) {
    let wide = width - width % WIDE_COLUMNS;
    for start in (0..wide).step_by(WIDE_COLUMNS) {
        column_group::<ROWS, WIDE_COLUMNS>(coefficients, matrix_row, start, width, out);
    }
    narrow_columns::<ROWS>(coefficients, matrix_row, wide, width, out);
}

/// Columns `from..width` of [`rows_times_matrix`] for `ROWS` rows: groups of [`LANES`], then
/// single columns.
#[inline(always)]
fn narrow_columns<'m, const ROWS: usize>(
    coefficients: &[&[f32]],
    matrix_row: impl Fn(usize) -> &'m [f32] + Copy,
    from: usize,
    width: usize,
    out: &mut [f32],
) {
    let lanes = from + (width - from) / LANES * LANES;
    for start in (from..lanes).step_by(LANES) {
        column_group::<ROWS, LANES>(coefficients, matrix_row, start, width, out);
    }
    for start in lanes..width {
        column_group::<ROWS, 1>(coefficients, matrix_row, start, width, out);
    }
}

/// Columns `start..start + COLS` of [`rows_times_matrix`] for the `ROWS` rows of
/// `coefficients`.
#[inline(always)]
fn column_group<'m, const ROWS: usize, const COLS: usize>(
    coefficients: &[&[f32]],
    matrix_row: impl Fn(usize) -> &'m [f32],
    start: usize,
    width: usize,
    out: &mut [f32],
) {
    let terms = coefficients[0].len();
    // A fixed number of rows keeps every sum in a register.
    let rows: &[&[f32]; ROWS] = coefficients.try_into().expect("ROWS rows");
    let mut acc = [[0f32; COLS]; ROWS];
    let ahead = rows_ahead(COLS);
    for i in 0..terms {
        if i + ahead < terms {
            prefetch(&matrix_row(i + ahead)[start..start + COLS]);
        }
        let row: &[f32; COLS] = matrix_row(i)[start..start + COLS]
            .try_into()
            .expect("a group of COLS columns");
        for (acc, coefficients) in acc.iter_mut().zip(rows) {
            let c = coefficients[i];
            for l in 0..COLS {
                acc[l] += c * row[l];
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        out[r * width + start..r * width + start + COLS].copy_from_slice(acc);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// [`super::rows_times_matrix`] for `ROWS` rows on 512-bit registers, in groups of
    /// `VECTORS` vectors of 16 columns (the rows' sums, `ROWS · VECTORS` vectors, stay in
    /// registers), then the plain loop's narrow groups: the same product and then sum per
    /// column and term, in the same order (never fused), so the same bits as the plain loop,
    /// which the compiler keeps to 256-bit registers.
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn columns_in_groups<'m, const ROWS: usize, const VECTORS: usize>(
        coefficients: &[&[f32]],
        matrix_row: impl Fn(usize) -> &'m [f32] + Copy,
        width: usize,
        out: &mut [f32],
    ) {
        let group = 16 * VECTORS;
        let terms = coefficients[0].len();
        let rows: &[&[f32]; ROWS] = coefficients.try_into().expect("ROWS rows");
        assert!(rows.iter().all(|r| r.len() == terms) && out.len() >= ROWS * width);
        let wide = width - width % group;
        let ahead = super::rows_ahead(group);
        for start in (0..wide).step_by(group) {
            let mut acc = [[_mm512_setzero_ps(); VECTORS]; ROWS];
            for i in 0..terms {
                if i + ahead < terms {
                    super::prefetch(&matrix_row(i + ahead)[start..start + group]);
                }
                let columns = &matrix_row(i)[start..start + group];
                // SAFETY: `columns` holds VECTORS loads of 16.
                let values: [__m512; VECTORS] = std::array::from_fn(|v| unsafe {
                    _mm512_loadu_ps(columns.as_ptr().add(16 * v))
                });
                for (acc, coefficients) in acc.iter_mut().zip(rows) {
                    let c = _mm512_set1_ps(coefficients[i]);
                    for (acc, values) in acc.iter_mut().zip(&values) {
                        *acc = _mm512_add_ps(*acc, _mm512_mul_ps(c, *values));
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                let row = &mut out[r * width + start..r * width + start + group];
                for (v, acc) in acc.iter().enumerate() {
                    // SAFETY: `row` holds VECTORS stores of 16.
                    unsafe { _mm512_storeu_ps(row.as_mut_ptr().add(16 * v), *acc) };
                }
            }
        }
        super::narrow_columns::<ROWS>(coefficients, matrix_row, wide, width, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_on_registers_are_the_lanes_in_plain_rust() {
        let vector = |seed: usize| -> Vec<f32> {
            (0..136)
                .map(|i| ((i * 7919 + seed * 104_729) % 1000) as f32 / 97.0 - 5.1)
                .collect()
        };
        let vectors: Vec<Vec<f32>> = (0..16).map(vector).collect();
        let pairs: [(&[f32], &[f32]); 8] =
            std::array::from_fn(|p| (vectors[p].as_slice(), vectors[15 - p].as_slice()));
        let expected = portable_pair_lanes(&pairs, 136);
        assert_eq!(
            pair_lanes(&pairs, 136).map(|l| l.map(f32::to_bits)),
            expected.map(|l| l.map(f32::to_bits))
        );
        assert_ne!(expected[0], [0.0; 8]);
    }

    #[test]
    fn row_products_sum_every_column_in_term_order() {
        let value = |i: usize, j: usize| (((i + 5) * (j + 11) * 7919) % 307) as f32 / 53.0 - 2.9;
        for width in [1, 15, 16, 17, 48, 64, 80, 100, 128, 150] {
            let terms = 37;
            let matrix: Vec<Vec<f32>> = (0..terms)
                .map(|i| (0..width).map(|c| value(i, c)).collect())
                .collect();
            for rows in 1..=MAX_PRODUCT_ROWS {
                let coefficients: Vec<Vec<f32>> = (0..rows)
                    .map(|r| (0..terms).map(|i| value(100 + r, i)).collect())
                    .collect();
                let slices: Vec<&[f32]> = coefficients.iter().map(Vec::as_slice).collect();
                let mut fastest = vec![f32::NAN; rows * width];
                rows_times_matrix(&slices, |i| matrix[i].as_slice(), width, &mut fastest);
                let mut plain = vec![f32::NAN; rows * width];
                plain_rows_product(&slices, |i| matrix[i].as_slice(), width, &mut plain);
                for (r, coefficients) in coefficients.iter().enumerate() {
                    for c in 0..width {
                        let mut sum = 0f32;
                        for (i, &a) in coefficients.iter().enumerate() {
                            sum += a * matrix[i][c];
                        }
                        for out in [&fastest, &plain] {
                            assert_eq!(
                                out[r * width + c].to_bits(),
                                sum.to_bits(),
                                "{width} {r} {c}"
                            );
                        }
                    }
                }
            }
        }
    }
}
