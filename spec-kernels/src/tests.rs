//! Every kernel against a plain reference, on random blocks of every format and odd sizes.

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::activations::QuantizedTokens;
use crate::{dequantize_block, parse_cache_size, Format, Isa, KernelError, QMatrix};

fn random_matrix(format: Format, rows: usize, cols: usize, rng: &mut StdRng) -> QMatrix {
    QMatrix::new(format, rows, cols, random_blocks(format, rows, cols, rng)).unwrap()
}

/// Random blocks: every quant and scale byte random, f16 scale fields finite and moderate.
fn random_blocks(format: Format, rows: usize, cols: usize, rng: &mut StdRng) -> Vec<u8> {
    let blocks = rows * cols / format.block_len();
    let mut data = Vec::with_capacity(blocks * format.block_bytes());
    for _ in 0..blocks {
        let mut block: Vec<u8> = (0..format.block_bytes()).map(|_| rng.random()).collect();
        let scale_fields: &[usize] = match format {
            Format::Q4_1 | Format::Q4K => &[0, 2],
            Format::Q6K => &[208],
            _ => &[0],
        };
        for &at in scale_fields {
            let v = half::f16::from_f32(rng.random_range(-0.05f32..0.05));
            block[at..at + 2].copy_from_slice(&v.to_le_bytes());
        }
        data.extend(block);
    }
    data
}

fn random_input(tokens: usize, cols: usize, rng: &mut StdRng) -> Vec<f32> {
    (0..tokens * cols)
        .map(|_| {
            // Mostly small values with a few outliers, as activations are.
            let v: f32 = rng.random_range(-1.0..1.0);
            if rng.random_bool(0.02) {
                v * 20.0
            } else {
                v
            }
        })
        .collect()
}

fn dequantized(w: &QMatrix) -> Vec<f32> {
    let mut all = vec![0f32; w.rows() * w.cols()];
    for (r, row) in all.chunks_exact_mut(w.cols()).enumerate() {
        w.dequantize_row(r, row).unwrap();
    }
    all
}

fn matmul(w: &QMatrix, isa: Isa, x: &[f32], tokens: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; tokens * w.rows()];
    w.matmul_with(isa, x, tokens, &mut out).unwrap();
    out
}

fn sizes() -> impl Strategy<Value = (usize, usize, usize, usize, u64)> {
    (
        0..Format::ALL.len(),
        1usize..37,
        1usize..5,
        1usize..18,
        any::<u64>(),
    )
}

/// A random matrix of one format with `rows` rows of `blocks` blocks, and `tokens` inputs.
struct Case {
    format: Format,
    cols: usize,
    tokens: usize,
    w: QMatrix,
    x: Vec<f32>,
}

fn case((format, rows, blocks, tokens, seed): (usize, usize, usize, usize, u64)) -> Case {
    let format = Format::ALL[format];
    let mut rng = StdRng::seed_from_u64(seed);
    let cols = blocks * format.block_len();
    let w = random_matrix(format, rows, cols, &mut rng);
    let x = random_input(tokens, cols, &mut rng);
    Case {
        format,
        cols,
        tokens,
        w,
        x,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The kernel computes exactly (to f32 rounding) the dot product of the dequantized
    /// weights with the quantized activations it was given.
    #[test]
    fn kernels_compute_the_dot_products_of_their_quantized_operands(
        sizes in sizes()
    ) {
        let Case { format, cols, tokens, w, x } = case(sizes);
        let rows = w.rows();
        let block = format.block_len();
        let acts = QuantizedTokens::new(&x, tokens, cols, block);
        let weights = dequantized(&w);
        let got = matmul(&w, Isa::Portable, &x, tokens);
        for t in 0..tokens {
            let a: Vec<f64> = acts.quants_of(t).iter().enumerate()
                .map(|(c, &q)| q as f64 * acts.scales_of(t)[c / block] as f64)
                .collect();
            for r in 0..rows {
                let row = &weights[r * cols..(r + 1) * cols];
                let exact: f64 = row.iter().zip(&a).map(|(&w, &a)| w as f64 * a).sum();
                let magnitude: f64 = row.iter().zip(&a).map(|(&w, &a)| (w as f64 * a).abs()).sum();
                let y = got[t * rows + r] as f64;
                prop_assert!((y - exact).abs() <= 1e-5 * magnitude + 1e-9,
                    "{format:?} row {r} token {t}: {y} vs {exact} (magnitude {magnitude})");
            }
        }
    }

    /// Against the unquantized activations, the error is that of 8-bit activations.
    #[test]
    fn kernels_approximate_the_float_product(
        sizes in sizes()
    ) {
        let Case { format, cols, tokens, w, x } = case(sizes);
        let rows = w.rows();
        let weights = dequantized(&w);
        let got = matmul(&w, Isa::best(), &x, tokens);
        for t in 0..tokens {
            let x = &x[t * cols..(t + 1) * cols];
            for r in 0..rows {
                let row = &weights[r * cols..(r + 1) * cols];
                let exact: f64 = row.iter().zip(x).map(|(&w, &x)| w as f64 * x as f64).sum();
                let norm = (row.iter().map(|&w| (w as f64).powi(2)).sum::<f64>()
                    * x.iter().map(|&x| (x as f64).powi(2)).sum::<f64>()).sqrt();
                let y = got[t * rows + r] as f64;
                prop_assert!((y - exact).abs() <= 0.02 * norm + 1e-9,
                    "{format:?}: {y} vs {exact} (norm {norm})");
            }
        }
    }

    /// Every instruction set this CPU has gives the portable path's bits.
    #[test]
    fn every_instruction_set_gives_identical_bits(
        sizes in sizes()
    ) {
        let Case { format, tokens, w, x, .. } = case(sizes);
        let portable = matmul(&w, Isa::Portable, &x, tokens);
        for isa in Isa::all().into_iter().filter(|isa| isa.available()) {
            let got = matmul(&w, isa, &x, tokens);
            prop_assert!(got.iter().zip(&portable).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{isa:?} {format:?}: {got:?} vs {portable:?}");
        }
    }

    /// A token's result does not depend on the batch it came in.
    #[test]
    fn results_do_not_depend_on_the_batch(
        sizes in sizes()
    ) {
        let Case { format, cols, tokens, w, x } = case(sizes);
        for isa in Isa::all().into_iter().filter(|isa| isa.available()) {
            let batch = matmul(&w, isa, &x, tokens);
            for t in 0..tokens {
                let alone = matmul(&w, isa, &x[t * cols..(t + 1) * cols], 1);
                let in_batch = &batch[t * w.rows()..(t + 1) * w.rows()];
                prop_assert!(alone.iter().zip(in_batch).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{isa:?} {format:?} token {t} of {tokens}");
            }
        }
    }
}

#[test]
fn an_instruction_set_the_cpu_lacks_is_refused() {
    let mut rng = StdRng::seed_from_u64(13);
    let w = random_matrix(Format::Q4_0, 16, 64, &mut rng);
    let x = random_input(1, 64, &mut rng);
    for isa in Isa::all() {
        let mut out = vec![0f32; 16];
        let result = w.matmul_with(isa, &x, 1, &mut out);
        if isa.available() {
            assert_eq!(result, Ok(()), "{isa:?}");
        } else {
            assert_eq!(result, Err(KernelError::Unsupported(isa)));
        }
    }
    assert!(Isa::Portable.available());
    assert!(Isa::best().available());
}

#[test]
fn batches_longer_than_one_pass_match_single_tokens() {
    let mut rng = StdRng::seed_from_u64(3);
    let (rows, cols, tokens) = (33, 512, crate::MAX_TOKENS_PER_PASS + 7);
    for format in Format::ALL {
        let w = random_matrix(format, rows, cols, &mut rng);
        let x = random_input(tokens, cols, &mut rng);
        let batch = matmul(&w, Isa::best(), &x, tokens);
        for t in [
            0,
            crate::MAX_TOKENS_PER_PASS - 1,
            crate::MAX_TOKENS_PER_PASS,
            tokens - 1,
        ] {
            let alone = matmul(&w, Isa::best(), &x[t * cols..(t + 1) * cols], 1);
            assert_eq!(
                alone,
                batch[t * rows..(t + 1) * rows],
                "{format:?} token {t}"
            );
        }
    }
}

#[test]
fn several_matrices_of_one_input_match_their_separate_products() {
    let mut rng = StdRng::seed_from_u64(21);
    let cols = 512;
    let matrices: Vec<QMatrix> = [(Format::Q4K, 40), (Format::Q8_0, 7), (Format::Q6K, 17)]
        .into_iter()
        .map(|(format, rows)| random_matrix(format, rows, cols, &mut rng))
        .collect();
    let all: Vec<&QMatrix> = matrices.iter().collect();
    for tokens in [1, 5, crate::MAX_TOKENS_PER_PASS + 3] {
        let x = random_input(tokens, cols, &mut rng);
        for isa in Isa::all().into_iter().filter(|isa| isa.available()) {
            let mut outs: Vec<Vec<f32>> = matrices
                .iter()
                .map(|m| vec![f32::NAN; tokens * m.rows()])
                .collect();
            let mut views: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
            QMatrix::matmul_many_with(isa, &all, &x, tokens, &mut views).unwrap();
            for (m, out) in matrices.iter().zip(&outs) {
                assert_eq!(*out, matmul(m, isa, &x, tokens), "{isa:?} {:?}", m.format());
            }
        }
    }
    let narrow = random_matrix(Format::Q8_0, 3, 256, &mut rng);
    let mut a = vec![0f32; matrices[0].rows()];
    let mut b = vec![0f32; 3];
    assert!(matches!(
        QMatrix::matmul_many(
            &[&matrices[0], &narrow],
            &[0.0; 512],
            1,
            &mut [&mut a, &mut b]
        ),
        Err(KernelError::WrongLength {
            what: "a matrix's columns",
            ..
        })
    ));
    assert!(matches!(
        QMatrix::matmul_many(&[&matrices[0]], &[0.0; 512], 1, &mut []),
        Err(KernelError::WrongLength {
            what: "the outputs",
            ..
        })
    ));
}

#[test]
fn a_threads_reused_buffers_carry_nothing_from_one_product_to_the_next() {
    // Each product on a thread that has run a larger one, of the other block length, more
    // tokens, more tasks and more tiles, equals the same product on a new thread, whose
    // buffers start empty.
    let mut rng = StdRng::seed_from_u64(23);
    let big = random_matrix(Format::Q6K, 96, 1024, &mut rng);
    let big_input = random_input(40, 1024, &mut rng);
    for format in Format::ALL {
        let small = random_matrix(format, 33, 256, &mut rng);
        for tokens in [1, 3, 9] {
            let x = random_input(tokens, 256, &mut rng);
            for isa in Isa::all().into_iter().filter(|isa| isa.available()) {
                let fresh = std::thread::scope(|s| {
                    s.spawn(|| matmul(&small, isa, &x, tokens)).join().unwrap()
                });
                matmul(&big, isa, &big_input, 40);
                assert_eq!(
                    matmul(&small, isa, &x, tokens),
                    fresh,
                    "{format:?}, {tokens} tokens, {isa:?}"
                );
            }
        }
    }
}

#[test]
fn matrices_hold_the_values_of_their_ggml_blocks() {
    let mut rng = StdRng::seed_from_u64(8);
    for format in Format::ALL {
        let (rows, cols) = (3, 2 * format.block_len());
        let bytes = random_blocks(format, rows, cols, &mut rng);
        let mut expected = vec![0f32; rows * cols];
        for (block, out) in bytes
            .chunks_exact(format.block_bytes())
            .zip(expected.chunks_exact_mut(format.block_len()))
        {
            dequantize_block(format, block, out);
        }
        let w = QMatrix::new(format, rows, cols, bytes).unwrap();
        assert_eq!(dequantized(&w), expected, "{format:?}");
    }
}

/// The largest quants against the largest activations: the kernels' narrow 16-bit sums are
/// filled to their bound (eight products of nibbles 15, four of 5-bit quants 31, two of 6-bit
/// quants 63, each times 127), and every instruction set still gives the exact integer sums.
#[test]
fn the_largest_quants_and_activations_do_not_overflow() {
    let cols = 512;
    for format in Format::ALL {
        for fill in [0xFF, 0x80, 0x7F] {
            let mut blocks = random_blocks(format, 16, cols, &mut StdRng::seed_from_u64(1));
            let scale_at = match format {
                Format::Q6K => 208,
                _ => 0,
            };
            for block in blocks.chunks_exact_mut(format.block_bytes()) {
                block.fill(fill);
                block[scale_at..scale_at + 2]
                    .copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
                if matches!(format, Format::Q4_1 | Format::Q4K) {
                    block[2..4].copy_from_slice(&half::f16::from_f32(0.02).to_le_bytes());
                }
            }
            let w = QMatrix::new(format, 16, cols, blocks).unwrap();
            let weights = dequantized(&w);
            let signs: [fn(usize) -> f32; 3] =
                [|_| 1.0, |_| -1.0, |c| if c % 8 < 4 { 1.0 } else { -1.0 }];
            for sign in signs {
                let x: Vec<f32> = (0..12 * cols).map(|i| sign(i % cols)).collect();
                let portable = matmul(&w, Isa::Portable, &x, 12);
                for (r, row) in weights.chunks_exact(cols).enumerate() {
                    let exact: f64 = row
                        .iter()
                        .enumerate()
                        .map(|(c, &w)| w as f64 * sign(c) as f64)
                        .sum();
                    let magnitude: f64 = row.iter().map(|&w| w.abs() as f64).sum();
                    let y = portable[12 * r] as f64;
                    assert!(
                        (y - exact).abs() <= 1e-5 * magnitude + 1e-9,
                        "{format:?} {fill:#x} row {r}: {y} vs {exact}"
                    );
                }
                for isa in Isa::all().into_iter().filter(|isa| isa.available()) {
                    // One token, and the widest tiles of every format and instruction set.
                    for tokens in [1, 5, 8, 12] {
                        let got = matmul(&w, isa, &x[..tokens * cols], tokens);
                        assert!(
                            (0..16 * tokens).all(|i| {
                                let (r, t) = (i / tokens, i % tokens);
                                got[i].to_bits() == portable[12 * r + t].to_bits()
                            }),
                            "{isa:?} {format:?} {fill:#x} {tokens} tokens: {got:?} vs {portable:?}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn zero_activations_give_zero() {
    let mut rng = StdRng::seed_from_u64(5);
    for format in Format::ALL {
        let w = random_matrix(format, 7, 256, &mut rng);
        let out = matmul(&w, Isa::best(), &[0.0; 256], 1);
        assert!(out.iter().all(|&y| y == 0.0), "{format:?}: {out:?}");
    }
}

#[test]
fn known_blocks_dequantize_as_ggml_defines_them() {
    // Q4_0: d = 0.5, bytes 0x21 → elements 0..16 are (1 − 8)·0.5, 16..32 are (2 − 8)·0.5.
    let mut block = half::f16::from_f32(0.5).to_le_bytes().to_vec();
    block.extend([0x21u8; 16]);
    let mut out = [0f32; 32];
    dequantize_block(Format::Q4_0, &block, &mut out);
    assert_eq!(out[0], -3.5);
    assert_eq!(out[31], -3.0);
    // Q5_0: high bit of element 17 set → (2 | 16) − 16 = 2.
    let mut block = half::f16::from_f32(1.0).to_le_bytes().to_vec();
    block.extend((1u32 << 17).to_le_bytes());
    block.extend([0x21u8; 16]);
    dequantize_block(Format::Q5_0, &block, &mut out);
    assert_eq!((out[1], out[17], out[16]), (-15.0, 2.0, -14.0));
}

#[test]
fn bad_shapes_are_errors() {
    assert!(matches!(
        QMatrix::new(Format::Q4K, 2, 100, vec![0; 10]),
        Err(KernelError::RaggedRow { .. })
    ));
    assert!(matches!(
        QMatrix::new(Format::Q8_0, 2, 32, vec![0; 67]),
        Err(KernelError::WrongLength { .. })
    ));
    let w = QMatrix::new(Format::Q8_0, 2, 32, vec![0; 68]).unwrap();
    let mut out = vec![0f32; 2];
    assert!(w.matmul(&[0.0; 31], 1, &mut out).is_err());
    assert!(w.matmul(&[0.0; 32], 1, &mut out[..1]).is_err());
    assert_eq!(
        w.dequantize_row(2, &mut [0.0; 32]),
        Err(KernelError::RowOutOfRange { row: 2, rows: 2 })
    );
}

#[test]
fn sizes_past_usize_are_errors_not_wrapped_products() {
    // 2⁶³ rows of 18 bytes wrap to 0 bytes, which an empty buffer would have matched.
    let half_of_usize = 1 << (usize::BITS - 1);
    assert!(matches!(
        QMatrix::new(Format::Q4_0, half_of_usize, 32, Vec::new()),
        Err(KernelError::TooLarge {
            what: "the weight data",
            ..
        })
    ));
    // Q8_0 rows take more bytes than weights: a row of nearly usize::MAX weights overflows.
    assert!(matches!(
        QMatrix::new(Format::Q8_0, 1, usize::MAX - 31, Vec::new()),
        Err(KernelError::TooLarge {
            what: "a row of the weight data",
            ..
        })
    ));
    // 2⁶³ tokens of 2 outputs and 32 inputs wrap to empty buffers.
    let w = QMatrix::new(Format::Q8_0, 2, 32, vec![0; 68]).unwrap();
    for isa in Isa::all().into_iter().filter(|isa| isa.available()) {
        assert!(matches!(
            w.matmul_with(isa, &[], half_of_usize, &mut []),
            Err(KernelError::TooLarge { .. })
        ));
    }
}

#[test]
fn guided_tasks_cover_every_row_once_in_shrinking_panels() {
    let mut rng = StdRng::seed_from_u64(11);
    let matrices = [
        random_matrix(Format::Q8_0, 1536, 32, &mut rng),
        random_matrix(Format::Q8_0, 256, 32, &mut rng),
        random_matrix(Format::Q8_0, 37, 32, &mut rng),
    ];
    let refs: Vec<&QMatrix> = matrices.iter().collect();
    // One list refilled for every thread count, as a calling thread's scratch is.
    let mut tasks = Vec::new();
    for threads in 1..=4 {
        crate::guided_tasks(&refs, threads, &mut tasks);
        for (i, m) in matrices.iter().enumerate() {
            let mut next = 0;
            for (_, rows) in tasks.iter().filter(|(owner, _)| *owner == i) {
                assert_eq!(rows.start, next, "matrix {i} with {threads} threads");
                assert!(rows.start.is_multiple_of(16) && rows.end > rows.start);
                next = rows.end;
            }
            assert_eq!(next, m.rows());
        }
        let sizes: Vec<usize> = tasks.iter().map(|(_, r)| r.len()).collect();
        assert!(sizes.first() > sizes.last(), "{sizes:?}");
        assert!(
            sizes[sizes.len() - 3..].iter().all(|&s| s <= 32),
            "{sizes:?}"
        );
    }
}

#[test]
fn parallel_chunks_visit_every_chunk_once() {
    for (len, chunk) in [(0, 3), (1, 1), (10, 3), (64, 16), (1000, 7)] {
        let mut out = vec![usize::MAX; len];
        crate::parallel_chunks_mut(&mut out, chunk, &|index, values| {
            assert!(values.len() == chunk || (index + 1) * chunk >= len);
            for (offset, v) in values.iter_mut().enumerate() {
                assert_eq!(*v, usize::MAX, "written twice");
                *v = index * chunk + offset;
            }
        });
        assert_eq!(out, (0..len).collect::<Vec<_>>());
    }
}

#[test]
fn the_matmul_order_predicts_what_followed_last_time() {
    let mut rng = StdRng::seed_from_u64(7);
    // Three small matmuls (well under the look-ahead) and one larger than it, in a loop.
    let small: Vec<QMatrix> = (0..3)
        .map(|_| random_matrix(Format::Q8_0, 32, 64, &mut rng))
        .collect();
    let large = random_matrix(Format::Q8_0, 16 * 1024, 64, &mut rng);
    let list = |ms: &[&QMatrix]| crate::WarmList::of(ms);
    let mut order = crate::MatmulOrder::default();
    let sequence = [vec![&small[0], &small[1]], vec![&small[2]], vec![&large]];
    for step in &sequence {
        assert_eq!(order.record(step).as_slice(), &[], "nothing is known yet");
    }
    // The second time round, each matmul predicts those after it until the look-ahead is read,
    // and never wraps around to itself.
    let mut expected = list(&[&small[2]]);
    assert!(expected.extend(&list(&[&large])));
    assert_eq!(order.record(&sequence[0]), expected);
    assert_eq!(order.record(&sequence[1]), list(&[&large]));
    let mut expected = list(&[&small[0], &small[1]]);
    assert!(expected.extend(&list(&[&small[2]])));
    assert_eq!(order.record(&sequence[2]), expected);
    // A change of order is learned at once: now the large matmul was followed by the third.
    order.record(&sequence[1]);
    assert_eq!(order.record(&sequence[2]), list(&[&small[2]]));
}

#[test]
fn warming_freed_memory_is_harmless() {
    let mut rng = StdRng::seed_from_u64(8);
    let x = random_input(1, 64, &mut rng);
    let mut out = vec![0f32; 32];
    for _ in 0..50 {
        // Each matrix is dropped while the pool still expects its successor to be the next.
        let w = random_matrix(Format::Q4_0, 32, 64, &mut rng);
        w.matmul(&x, 1, &mut out).unwrap();
        let reference = matmul(&w, Isa::Portable, &x, 1);
        assert_eq!(out, reference);
    }
}

#[test]
fn cache_sizes_read_as_sysfs_writes_them() {
    assert_eq!(parse_cache_size("307200K\n"), Some(300 << 20));
    assert_eq!(parse_cache_size("32M"), Some(32 << 20));
    assert_eq!(parse_cache_size("1G"), Some(1 << 30));
    assert_eq!(parse_cache_size("512"), Some(512));
    assert_eq!(parse_cache_size(""), None);
    assert_eq!(parse_cache_size("K"), None);
    assert_eq!(parse_cache_size("12X"), None);
}
