//! The resolver on a temporary models folder.

use std::fs;
use std::path::Path;

use spec_models::{sha256_file, Check, Error, FileState, Registry, Store, VERIFIED_RECORD};

const CONTENT: &[u8] = b"GGUF and some weights";

fn registry() -> Registry {
    let sha = {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        fs::write(&path, CONTENT).unwrap();
        sha256_file(&path).unwrap()
    };
    Registry::parse(&format!(
        r#"
[[model]]
name = "tiny-chat"
kind = "chat-llm"
format = "gguf"
description = "pinned"
repo = "owner/tiny-chat-GGUF"
revision = "main"
files = [
  {{ remote = "tiny-q4.gguf", local = "model.gguf", size = {size}, sha256 = "{sha}" }},
  {{ remote = "extra/notes.txt" }},
]

[[model]]
name = "tts-model"
kind = "tts"
format = "cosyvoice"
description = "unpinned"
repo = "owner/tts"
revision = "main"
files = [{{ remote = "llm.pt" }}]
"#,
        size = CONTENT.len()
    ))
    .unwrap()
}

fn place(root: &Path, relative: &str, content: &[u8]) {
    let path = root.join(relative);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, content).unwrap();
}

#[test]
fn a_complete_model_resolves_to_its_files_and_is_hashed_once() {
    let root = tempfile::tempdir().unwrap();
    let registry = registry();
    let store = Store::new(root.path(), &registry);
    place(root.path(), "tiny-chat/model.gguf", CONTENT);
    place(root.path(), "tiny-chat/extra/notes.txt", b"notes");
    let files = store.resolve("tiny-chat").unwrap();
    assert_eq!(files.dir, root.path().join("tiny-chat"));
    assert_eq!(
        files.file("model.gguf"),
        Some(root.path().join("tiny-chat/model.gguf").as_path())
    );
    assert_eq!(files.with_extension("gguf").len(), 1);
    assert_eq!(files.entry.as_ref().unwrap().name, "tiny-chat");

    // The verification was recorded: the check reports it without hashing again.
    assert!(root
        .path()
        .join("tiny-chat")
        .join(VERIFIED_RECORD)
        .is_file());
    let states = store
        .check(registry.get("tiny-chat").unwrap(), Check::Size)
        .unwrap();
    assert_eq!(states[0].1, FileState::Verified);
    assert_eq!(states[1].1, FileState::Present);
}

#[test]
fn a_missing_model_names_the_folder_and_how_to_place_the_files() {
    let root = tempfile::tempdir().unwrap();
    let registry = registry();
    let store = Store::new(root.path(), &registry);
    let err = store.resolve("tiny-chat").unwrap_err();
    assert!(matches!(err, Error::NotPresent { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("model.gguf is missing"), "{text}");
    assert!(
        text.contains(&root.path().join("tiny-chat").display().to_string()),
        "{text}"
    );
    assert!(text.contains("spec_models::download::Downloader"), "{text}");
    assert!(
        text.contains("https://huggingface.co/owner/tiny-chat-GGUF/resolve/main/tiny-q4.gguf"),
        "{text}"
    );

    // One file of two present: still not usable.
    place(root.path(), "tiny-chat/model.gguf", CONTENT);
    let text = store.resolve("tiny-chat").unwrap_err().to_string();
    assert!(text.contains("extra/notes.txt is missing"), "{text}");
}

#[test]
fn a_corrupt_file_is_reported_even_after_an_earlier_verification() {
    let root = tempfile::tempdir().unwrap();
    let registry = registry();
    let store = Store::new(root.path(), &registry);
    place(root.path(), "tiny-chat/extra/notes.txt", b"notes");
    let mut corrupt = CONTENT.to_vec();
    corrupt[3] ^= 1;
    place(root.path(), "tiny-chat/model.gguf", &corrupt);
    match store.resolve("tiny-chat").unwrap_err() {
        Error::ChecksumMismatch {
            path,
            expected,
            actual,
        } => {
            assert!(path.ends_with("tiny-chat/model.gguf"));
            assert_ne!(expected, actual);
        }
        other => panic!("expected a checksum mismatch, got {other:?}"),
    }

    // Verified once, then changed on disk: the record no longer vouches for it.
    place(root.path(), "tiny-chat/model.gguf", CONTENT);
    store.resolve("tiny-chat").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    place(root.path(), "tiny-chat/model.gguf", &corrupt);
    assert!(matches!(
        store.resolve("tiny-chat"),
        Err(Error::ChecksumMismatch { .. })
    ));
}

#[test]
fn truncated_and_partial_files_are_told_apart() {
    let root = tempfile::tempdir().unwrap();
    let registry = registry();
    let store = Store::new(root.path(), &registry);
    place(root.path(), "tiny-chat/extra/notes.txt", b"notes");
    place(root.path(), "tiny-chat/model.gguf", &CONTENT[..7]);
    match store.resolve("tiny-chat").unwrap_err() {
        Error::WrongSize {
            expected, actual, ..
        } => {
            assert_eq!((expected, actual), (CONTENT.len() as u64, 7));
        }
        other => panic!("expected a wrong size, got {other:?}"),
    }

    fs::remove_file(root.path().join("tiny-chat/model.gguf")).unwrap();
    place(root.path(), "tiny-chat/model.gguf.partial", &CONTENT[..7]);
    let text = store.resolve("tiny-chat").unwrap_err().to_string();
    assert!(
        text.contains("interrupted download (7 bytes so far"),
        "{text}"
    );
    let states = store
        .check(registry.get("tiny-chat").unwrap(), Check::Size)
        .unwrap();
    assert_eq!(states[0].1, FileState::Partial { bytes: 7 });
}

#[test]
fn folders_and_paths_outside_the_registry_are_taken_as_they_are() {
    let root = tempfile::tempdir().unwrap();
    let registry = registry();
    let store = Store::new(root.path(), &registry);

    // A folder placed by hand under a name the registry does not know.
    place(root.path(), "my-finetune/config.json", b"{}");
    place(root.path(), "my-finetune/model.safetensors", b"x");
    place(root.path(), "my-finetune/model.safetensors.partial", b"x");
    place(root.path(), "my-finetune/.hidden", b"x");
    let files = store.resolve("my-finetune").unwrap();
    assert!(files.entry.is_none());
    let names: Vec<_> = files
        .files
        .iter()
        .map(|p| p.file_name().unwrap().to_str().unwrap())
        .collect();
    assert_eq!(names, ["config.json", "model.safetensors"]);

    // A path to a file, and to a folder.
    let file = root.path().join("my-finetune/model.safetensors");
    let by_path = store.resolve(file.to_str().unwrap()).unwrap();
    assert_eq!(by_path.files, [file]);
    let by_folder = store
        .resolve(root.path().join("my-finetune").to_str().unwrap())
        .unwrap();
    assert_eq!(by_folder.files.len(), 2);

    // Unpinned registry entries only need their files.
    place(root.path(), "tts-model/llm.pt", b"weights");
    assert_eq!(store.resolve("tts-model").unwrap().files.len(), 1);

    let err = store.resolve("no-such-model").unwrap_err();
    assert!(matches!(err, Error::UnknownModel { .. }));
    assert!(err.to_string().contains(&root.path().display().to_string()));
}

#[test]
fn evaluation_data_lives_under_data() {
    let root = tempfile::tempdir().unwrap();
    let registry = registry();
    let store = Store::new(root.path(), &registry);
    assert!(store.data_file("mt_bench/question.jsonl").is_err());
    place(root.path(), "data/mt_bench/question.jsonl", b"{}");
    assert_eq!(
        store.data_file("mt_bench/question.jsonl").unwrap(),
        root.path().join("data/mt_bench/question.jsonl")
    );
}

#[test]
#[ignore = "needs the real models (../shared/models/fetch)"]
fn the_voices_and_their_runtime_resolve_in_the_models_folder() {
    let store = Store::from_env().unwrap();
    let kokoro = store.resolve("kokoro-82m").unwrap();
    assert_eq!(kokoro.dir, store.root().join("kokoro-82m"));
    assert!(kokoro.entry.is_some());
    for name in [
        "model.onnx",
        "vocab.json",
        "af_heart.bin",
        "bm_george.bin",
        "us_gold.json",
    ] {
        assert!(kokoro.file(name).is_some(), "kokoro-82m: {name}");
    }
    let piper = store.resolve("piper-en_US-joe-medium").unwrap();
    assert!(piper.file("model.onnx.json").is_some());
    let runtime = store.resolve("onnxruntime").unwrap();
    assert!(runtime.file("libonnxruntime.so").is_some());
    // Every pinned file matched its checksum (or was verified before and is unchanged).
    for name in ["kokoro-82m", "piper-en_US-joe-medium"] {
        let entry = store.registry().get(name).unwrap();
        for (file, state) in store.check(entry, Check::Size).unwrap() {
            let expected = match file.sha256 {
                Some(_) => FileState::Verified,
                None => state.clone(),
            };
            assert_eq!(state, expected, "{name}: {}", file.local());
        }
    }
    // Silero VAD's three files, every one pinned, match their checksums.
    let vad = store.registry().get("silero-vad").unwrap();
    for (file, state) in store.check(vad, Check::Checksum).unwrap() {
        assert_eq!(state, FileState::Verified, "silero-vad: {}", file.local());
    }
}
