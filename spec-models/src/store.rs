//! The models folder and the resolver from a name or a path to a model's files.
//!
//! Layout: `<models folder>/<name>/<file>` for each file of a registry entry, saved under its
//! `local` name; `<models folder>/data/…` for evaluation data. A download in progress lives
//! next to its final name as `<file>.partial` and is renamed only once verified.
//! `.specvoice-verified.json` in a model's folder records the size, modification time and
//! SHA-256 of files already checked, so a 1 GB file is hashed once, not on every load.

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{io_error, Error, Result};
use crate::registry::{FileEntry, ModelEntry, Registry};

/// Name of the record of verified files in a model's folder.
pub const VERIFIED_RECORD: &str = ".specvoice-verified.json";
/// Suffix of a file being downloaded.
pub const PARTIAL_SUFFIX: &str = ".partial";

/// The models folder: `$SPECVOICE_MODELS`, else `~/.cache/specvoice/models`.
pub fn models_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("SPECVOICE_MODELS").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|home| PathBuf::from(home).join(".cache/specvoice/models"))
        .ok_or(Error::NoModelsFolder)
}

/// The files of one model, found on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelFiles {
    /// The registry name, or the folder / file name for a model given by path.
    pub name: String,
    /// The folder holding the files.
    pub dir: PathBuf,
    /// The registry entry, when the model is a known one.
    pub entry: Option<ModelEntry>,
    /// Every file of the model, sorted.
    pub files: Vec<PathBuf>,
}

impl ModelFiles {
    /// The file called `name` (its last path component), if present.
    pub fn file(&self, name: &str) -> Option<&Path> {
        self.files
            .iter()
            .map(PathBuf::as_path)
            .find(|p| p.file_name().is_some_and(|n| n == name))
    }

    /// The files whose name ends in `.extension`, sorted (e.g. the shards of a checkpoint).
    pub fn with_extension(&self, extension: &str) -> Vec<&Path> {
        self.files
            .iter()
            .map(PathBuf::as_path)
            .filter(|p| p.extension().is_some_and(|e| e == extension))
            .collect()
    }
}

/// What is on disk for one file of a registry entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileState {
    /// Present, and its pinned (or recorded) checksum was verified.
    Verified,
    /// Present with the right size; no checksum is pinned or recorded to compare with.
    Present,
    Missing,
    /// Only an interrupted download of `bytes` bytes.
    Partial {
        bytes: u64,
    },
    WrongSize {
        expected: u64,
        actual: u64,
    },
    ChecksumMismatch {
        expected: String,
        actual: String,
    },
}

impl FileState {
    pub fn is_usable(&self) -> bool {
        matches!(self, FileState::Verified | FileState::Present)
    }
}

/// How thoroughly [`Store::check`] looks at files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// Existence and size only (instant).
    Size,
    /// Size, and the SHA-256 of files not verified since they last changed.
    Checksum,
}

/// A models folder together with the registry that names its models.
#[derive(Clone, Debug)]
pub struct Store<'r> {
    root: PathBuf,
    registry: &'r Registry,
}

impl Store<'static> {
    /// The models folder of the environment ([`models_dir`]) with the built-in registry.
    pub fn from_env() -> Result<Self> {
        Ok(Store::new(models_dir()?, Registry::builtin()))
    }
}

impl<'r> Store<'r> {
    pub fn new(root: impl Into<PathBuf>, registry: &'r Registry) -> Self {
        Store {
            root: root.into(),
            registry,
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn registry(&self) -> &'r Registry {
        self.registry
    }

    /// The folder a model called `name` lives in.
    pub fn model_dir(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// A name or a path → the model's files. A bare name resolves in the models folder first
    /// (registry entries are checked: every file present with its pinned size and checksum; a
    /// folder placed there by hand is taken as it is); anything else that exists is taken as a
    /// path (a file, or a folder of files).
    pub fn resolve(&self, name_or_path: &str) -> Result<ModelFiles> {
        let looks_like_path = name_or_path.contains(['/', '\\']) || name_or_path.starts_with('.');
        if !looks_like_path {
            if let Some(entry) = self.registry.get(name_or_path) {
                return self.resolve_entry(entry);
            }
            let dir = self.model_dir(name_or_path);
            if dir.is_dir() {
                return from_folder(name_or_path.to_string(), dir, None);
            }
        }
        let path = PathBuf::from(name_or_path);
        if path.is_dir() {
            let name = file_name(&path);
            return from_folder(name, path, None);
        }
        if path.is_file() {
            let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
            return Ok(ModelFiles {
                name: file_name(&path),
                dir,
                entry: None,
                files: vec![path],
            });
        }
        Err(Error::UnknownModel {
            name: name_or_path.to_string(),
            searched: self.root.clone(),
        })
    }

    /// A file of the evaluation data, `<models folder>/data/<relative>`.
    pub fn data_file(&self, relative: &str) -> Result<PathBuf> {
        let path = self.root.join("data").join(relative);
        if path.is_file() {
            Ok(path)
        } else {
            Err(Error::Io {
                path,
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "evaluation data not found (the project's `../shared/models/fetch` places it; \
                     set SPECVOICE_MODELS to the folder that holds `data/`)",
                ),
            })
        }
    }

    /// The state of every file of `entry` in the models folder.
    pub fn check(&self, entry: &ModelEntry, level: Check) -> Result<Vec<(FileEntry, FileState)>> {
        let dir = self.model_dir(&entry.name);
        let mut record = VerifiedRecord::load(&dir);
        let mut states = Vec::with_capacity(entry.files.len());
        for file in &entry.files {
            let state = check_file(&dir, file, level, &mut record)?;
            states.push((file.clone(), state));
        }
        record.save(&dir);
        Ok(states)
    }

    fn resolve_entry(&self, entry: &ModelEntry) -> Result<ModelFiles> {
        let dir = self.model_dir(&entry.name);
        let states = self.check(entry, Check::Checksum)?;
        let mut problems = Vec::new();
        for (file, state) in &states {
            let path = dir.join(file.local());
            match state {
                FileState::Verified | FileState::Present => {}
                FileState::WrongSize { expected, actual } => {
                    return Err(Error::WrongSize {
                        path,
                        expected: *expected,
                        actual: *actual,
                    })
                }
                FileState::ChecksumMismatch { expected, actual } => {
                    return Err(Error::ChecksumMismatch {
                        path,
                        expected: expected.clone(),
                        actual: actual.clone(),
                    })
                }
                FileState::Missing => problems.push(format!("{} is missing", file.local())),
                FileState::Partial { bytes } => problems.push(format!(
                    "{} is an interrupted download ({bytes} bytes so far; downloading `{}` again \
                     resumes it)",
                    file.local(),
                    entry.name
                )),
            }
        }
        if !problems.is_empty() {
            return Err(Error::NotPresent {
                name: entry.name.clone(),
                dir: dir.clone(),
                problems: problems.join("; "),
                how_to_get: entry.manual_instructions(&dir),
            });
        }
        Ok(ModelFiles {
            name: entry.name.clone(),
            files: entry.files.iter().map(|f| dir.join(f.local())).collect(),
            dir,
            entry: Some(entry.clone()),
        })
    }
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// Every regular file under `dir` (recursively), skipping hidden files and partial downloads.
fn from_folder(name: String, dir: PathBuf, entry: Option<ModelEntry>) -> Result<ModelFiles> {
    let mut files = Vec::new();
    let mut pending = vec![dir.clone()];
    while let Some(folder) = pending.pop() {
        for item in fs::read_dir(&folder).map_err(io_error(&folder))? {
            let path = item.map_err(io_error(&folder))?.path();
            let visible = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| !n.starts_with('.') && !n.ends_with(PARTIAL_SUFFIX));
            if !visible {
                continue;
            }
            if path.is_dir() {
                pending.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(ModelFiles {
        name,
        dir,
        entry,
        files,
    })
}

pub(crate) fn check_file(
    dir: &Path,
    file: &FileEntry,
    level: Check,
    record: &mut VerifiedRecord,
) -> Result<FileState> {
    let path = dir.join(file.local());
    let metadata = match fs::metadata(&path) {
        Ok(m) if m.is_file() => m,
        Ok(_) => return Ok(FileState::Missing),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let partial = partial_path(&path);
            return Ok(match fs::metadata(&partial) {
                Ok(m) => FileState::Partial { bytes: m.len() },
                Err(_) => FileState::Missing,
            });
        }
        Err(e) => return Err(io_error(&path)(e)),
    };
    let actual_size = metadata.len();
    if let Some(expected) = file.size {
        if expected != actual_size {
            return Ok(FileState::WrongSize {
                expected,
                actual: actual_size,
            });
        }
    }
    let stamp = Stamp::of(&metadata, String::new());
    let recorded = record.files.get(file.local()).cloned();
    let expected = file
        .sha256
        .clone()
        .or_else(|| recorded.as_ref().map(|r| r.sha256.clone()));
    let Some(expected) = expected else {
        return Ok(FileState::Present);
    };
    if recorded
        .as_ref()
        .is_some_and(|r| r.same_file(&stamp) && r.sha256 == expected)
    {
        return Ok(FileState::Verified);
    }
    if level == Check::Size {
        return Ok(FileState::Present);
    }
    let actual = sha256_file(&path)?;
    if actual != expected {
        return Ok(FileState::ChecksumMismatch { expected, actual });
    }
    record.insert(
        file.local(),
        Stamp {
            sha256: actual,
            ..stamp
        },
    );
    Ok(FileState::Verified)
}

/// `<path>.partial`.
pub fn partial_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(PARTIAL_SUFFIX);
    PathBuf::from(name)
}

/// Lower-case hex SHA-256 of a file.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut file = fs::File::open(path).map_err(io_error(path))?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buffer).map_err(io_error(path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Stamp {
    size: u64,
    modified_ns: u128,
    sha256: String,
}

impl Stamp {
    pub(crate) fn of(metadata: &fs::Metadata, sha256: String) -> Self {
        let modified_ns = metadata
            .modified()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        Stamp {
            size: metadata.len(),
            modified_ns,
            sha256,
        }
    }

    fn same_file(&self, other: &Stamp) -> bool {
        self.size == other.size && self.modified_ns == other.modified_ns && self.modified_ns != 0
    }
}

/// The `.specvoice-verified.json` of one model folder.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct VerifiedRecord {
    files: BTreeMap<String, Stamp>,
    #[serde(skip)]
    changed: bool,
}

impl VerifiedRecord {
    pub(crate) fn load(dir: &Path) -> Self {
        fs::read_to_string(dir.join(VERIFIED_RECORD))
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default()
    }

    pub(crate) fn insert(&mut self, local: &str, stamp: Stamp) {
        self.files.insert(local.to_string(), stamp);
        self.changed = true;
    }

    /// Best effort: a read-only models folder only costs re-hashing next time.
    pub(crate) fn save(&self, dir: &Path) {
        if !self.changed {
            return;
        }
        let Ok(text) = serde_json::to_string_pretty(self) else {
            return;
        };
        let target = dir.join(VERIFIED_RECORD);
        let temporary = partial_path(&target);
        if fs::write(&temporary, text).is_ok() && fs::rename(&temporary, &target).is_err() {
            let _ = fs::remove_file(&temporary);
        }
    }
}
