use super::*;
use crate::fastest;

#[test]
fn the_memory_probe_sums_every_word() {
    let words: Vec<u64> = (0..1000u64)
        .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .collect();
    for len in [0, 1, 31, 32, 33, 999, 1000] {
        let expected = words[..len].iter().fold(0u64, |a, &x| a.wrapping_add(x));
        for prefetch in [false, true] {
            assert_eq!(sum_words(&words[..len], prefetch), expected, "{len} words");
        }
    }
}

#[test]
fn intel_cpus_prefetch_into_l2_unless_told_otherwise() {
    let (intel, amd) = (b"GenuineIntel", b"AuthenticAMD");
    assert_eq!(prefetch_into_for(None, intel), PrefetchInto::L2);
    assert_eq!(prefetch_into_for(None, amd), PrefetchInto::L1);
    assert_eq!(prefetch_into_for(Some("l1"), intel), PrefetchInto::L1);
    assert_eq!(prefetch_into_for(Some("l2"), amd), PrefetchInto::L2);
    assert_eq!(prefetch_into_for(Some("L3"), amd), PrefetchInto::L1);
    assert!(cpu_vendor().iter().all(u8::is_ascii));
}

#[test]
fn tiles_cover_every_token_once_within_their_bound() {
    let sizes = |tiling: Tiling, n: usize| tiling.sizes(n).collect::<Vec<_>>();
    assert_eq!(sizes(Tiling::Fours, 9), [4, 4, 1]);
    assert_eq!(sizes(Tiling::Fours, 3), [3]);
    assert_eq!(sizes(Tiling::Even { max: 8 }, 5), [5]);
    assert_eq!(sizes(Tiling::Even { max: 8 }, 9), [5, 4]);
    assert_eq!(sizes(Tiling::Even { max: 8 }, 16), [8, 8]);
    assert_eq!(sizes(Tiling::Even { max: 8 }, 17), [6, 6, 5]);
    assert_eq!(sizes(Tiling::Even { max: 12 }, 12), [12]);
    assert_eq!(sizes(Tiling::Even { max: 12 }, 16), [8, 8]);
    assert_eq!(sizes(Tiling::Even { max: 12 }, 25), [9, 8, 8]);
    for (tiling, max) in [
        (Tiling::Fours, 4),
        (Tiling::Even { max: 8 }, 8),
        (Tiling::Even { max: 12 }, 12),
    ] {
        for n in 1..=40 {
            let sizes = sizes(tiling, n);
            assert_eq!(sizes.iter().sum::<usize>(), n, "{tiling:?} {n}");
            assert!(
                sizes.iter().all(|s| (1..=max).contains(s)),
                "{tiling:?} {n}"
            );
        }
    }
}

#[test]
fn every_extension_a_path_is_compiled_with_is_detected() {
    for isa in Isa::all() {
        for feature in features(isa) {
            assert!(detected(feature).is_some(), "{isa:?} needs {feature}");
        }
    }
}

/// The kernel's own view of the CPU, independent of the standard library's detection.
#[cfg(target_os = "linux")]
#[test]
fn the_detected_paths_extensions_are_all_on_this_cpu() {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap();
    let flags: Vec<&str> = cpuinfo
        .lines()
        .find_map(|line| line.strip_prefix("flags"))
        .and_then(|line| line.split_once(':'))
        .map(|(_, flags)| flags.split_whitespace().collect())
        .unwrap();
    for isa in Isa::all().into_iter().filter(|isa| isa.available()) {
        for feature in features(isa) {
            let flag = match *feature {
                "avx512vnni" => "avx512_vnni",
                other => other,
            };
            assert!(flags.contains(&flag), "{isa:?} detected without {feature}");
        }
    }
    assert!(features(Isa::best())
        .iter()
        .all(|f| detected(f) == Some(true)));
}

#[test]
fn a_cpu_without_one_extension_falls_back_to_a_path_it_has() {
    let on = |cpu: &[&str]| fastest(|isa| supported(isa, |f| cpu.contains(&f)));
    assert_eq!(on(AVX512_VNNI), Isa::Avx512Vnni);
    assert_eq!(on(&[]), Isa::Portable);
    for missing in AVX512_VNNI {
        let cpu: Vec<&str> = AVX512_VNNI
            .iter()
            .copied()
            .filter(|f| f != missing)
            .collect();
        let expected = if AVX2.contains(missing) {
            Isa::Portable
        } else {
            Isa::Avx2
        };
        assert_eq!(on(&cpu), expected, "without {missing}");
    }
    // The AVX2 path once ran on AVX2 and FMA alone, though its scales need F16C.
    assert_eq!(on(&["avx", "avx2", "fma"]), Isa::Portable);
}
