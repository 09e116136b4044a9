use super::*;

#[test]
fn missing_heads_name_the_command_for_their_variant() {
    assert_eq!(
        training_command("m", "chained-3"),
        "cargo xtask train-heads m --heads 3 --kind chained"
    );
    for odd in ["latent", "big-4", "latent-x"] {
        assert_eq!(
            training_command("m", odd),
            format!(
                "cargo xtask train-heads m --heads COUNT --kind latent|projection|chained \
                 --variant {odd}"
            )
        );
    }
}

#[test]
fn fingerprints_tell_files_apart() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::write(&a, vec![1u8; 300_000]).unwrap();
    let mut other = vec![1u8; 300_000];
    other[150_000] = 2;
    std::fs::write(&b, other).unwrap();
    assert_ne!(
        weights_fingerprint(&a).unwrap(),
        weights_fingerprint(&b).unwrap()
    );
    assert_eq!(
        weights_fingerprint(&a).unwrap(),
        weights_fingerprint(&a).unwrap()
    );
    assert!(weights_fingerprint(&dir.path().join("none")).is_err());
}
