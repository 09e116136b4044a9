//! Resumable, verified downloads of registry models from the Hugging Face Hub.
//!
//! Each file is written to `<file>.partial`, continued with an HTTP range request when a
//! download was cut, checked against its pinned size and SHA-256, and only then renamed to its
//! final name: a half-written file is never where a model loader looks. Connecting and every read
//! are bounded by time-outs, so an unreachable hub gives an error, not a hang.

use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use crate::error::{io_error, Error, Result};
use crate::registry::{FileEntry, ModelEntry};
use crate::store::{
    check_file, partial_path, sha256_file, Check, ModelFiles, Stamp, Store, VerifiedRecord,
};

/// Settings of a [`Downloader`].
#[derive(Clone, Debug)]
pub struct DownloadOptions {
    /// Hub address; `https://huggingface.co`, or `$HF_ENDPOINT` with [`DownloadOptions::from_env`].
    pub endpoint: String,
    /// Bearer token for gated models (`$HF_TOKEN` with [`DownloadOptions::from_env`]).
    pub token: Option<String>,
    pub connect_timeout: Duration,
    /// Longest wait for the response headers, and for each read of the body.
    pub read_timeout: Duration,
    /// Tries per file; a cut connection resumes where it stopped.
    pub attempts: u32,
    /// Pause before the second try, doubled before each further one.
    pub retry_pause: Duration,
}

impl Default for DownloadOptions {
    fn default() -> Self {
        DownloadOptions {
            endpoint: "https://huggingface.co".into(),
            token: None,
            connect_timeout: Duration::from_secs(15),
            read_timeout: Duration::from_secs(60),
            attempts: 4,
            retry_pause: Duration::from_secs(2),
        }
    }
}

impl DownloadOptions {
    /// The defaults, with `HF_ENDPOINT` and `HF_TOKEN` from the environment when set.
    pub fn from_env() -> Self {
        let var = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
        let defaults = DownloadOptions::default();
        DownloadOptions {
            endpoint: var("HF_ENDPOINT").unwrap_or(defaults.endpoint.clone()),
            token: var("HF_TOKEN"),
            ..defaults
        }
    }
}

/// Reports the progress of a download (e.g. a progress bar).
pub trait Progress {
    /// A file starts (or resumes, with `done` bytes already on disk).
    fn start(&mut self, _file: &str, _total: Option<u64>, _done: u64) {}
    fn advance(&mut self, _bytes: u64) {}
    /// The file is complete and verified.
    fn finish(&mut self, _file: &str) {}
    /// A file already present and verified was skipped.
    fn skip(&mut self, _file: &str) {}
    /// A try failed and will be repeated.
    fn retry(&mut self, _file: &str, _reason: &str) {}
}

/// A [`Progress`] that reports nothing.
pub struct Silent;

impl Progress for Silent {}

/// Downloads registry models into a [`Store`].
pub struct Downloader {
    agent: ureq::Agent,
    options: DownloadOptions,
}

/// Why one try at a file failed, and whether another try may help.
struct Failure {
    reason: String,
    retry: bool,
}

impl Failure {
    fn retry(reason: impl Into<String>) -> Self {
        Failure {
            reason: reason.into(),
            retry: true,
        }
    }

    fn fatal(reason: impl Into<String>) -> Self {
        Failure {
            reason: reason.into(),
            retry: false,
        }
    }
}

impl Downloader {
    pub fn new(options: DownloadOptions) -> Self {
        let config = ureq::Agent::config_builder()
            .timeout_resolve(Some(options.connect_timeout))
            .timeout_connect(Some(options.connect_timeout))
            .timeout_recv_response(Some(options.read_timeout))
            .timeout_per_read(Some(options.read_timeout))
            .http_status_as_error(false)
            .build();
        Downloader {
            agent: ureq::Agent::new_with_config(config),
            options,
        }
    }

    pub fn options(&self) -> &DownloadOptions {
        &self.options
    }

    /// Brings every file of `entry` into the store (skipping those already present and
    /// verified, resuming partial ones) and returns the model's files. An entry whose files
    /// must be placed by hand ([`ModelEntry::manual`]) is resolved if they are there, and
    /// otherwise refused with its instructions.
    pub fn download(
        &self,
        store: &Store<'_>,
        entry: &ModelEntry,
        progress: &mut dyn Progress,
    ) -> Result<ModelFiles> {
        let dir = store.model_dir(&entry.name);
        if entry.manual.is_some() {
            return match store.resolve(&entry.name) {
                Err(Error::NotPresent { .. }) => Err(Error::ManualOnly {
                    name: entry.name.clone(),
                    how_to_get: entry.manual_instructions(&dir),
                }),
                resolved => resolved,
            };
        }
        fs::create_dir_all(&dir).map_err(io_error(&dir))?;
        let mut record = VerifiedRecord::load(&dir);
        for file in &entry.files {
            let path = dir.join(file.local());
            let state = check_file(&dir, file, Check::Checksum, &mut record)?;
            if state.is_usable() {
                progress.skip(file.local());
                continue;
            }
            if path.exists() {
                // A wrong final file (truncated or corrupt) is replaced, not resumed.
                fs::remove_file(&path).map_err(io_error(&path))?;
            }
            let stamp = self.fetch(entry, file, &path, progress)?;
            record.insert(file.local(), stamp);
            record.save(&dir);
            progress.finish(file.local());
        }
        record.save(&dir);
        store.resolve(&entry.name)
    }

    /// Downloads one file to `<path>.partial` with retries, verifies it, renames it to `path`.
    fn fetch(
        &self,
        entry: &ModelEntry,
        file: &FileEntry,
        path: &Path,
        progress: &mut dyn Progress,
    ) -> Result<Stamp> {
        let url = entry.url(&self.options.endpoint, file);
        let partial = partial_path(path);
        if let Some(parent) = partial.parent() {
            fs::create_dir_all(parent).map_err(io_error(parent))?;
        }
        let failed = |reason: String| Error::Download {
            name: entry.name.clone(),
            url: url.clone(),
            reason,
            how_to_get: entry.manual_instructions(path.parent().unwrap_or(path)),
        };
        let attempts = self.options.attempts.max(1);
        let mut pause = self.options.retry_pause;
        for attempt in 1..=attempts {
            match self.try_fetch(&url, file, &partial, progress) {
                Ok(()) => break,
                Err(failure) if failure.retry && attempt < attempts => {
                    progress.retry(file.local(), &failure.reason);
                    std::thread::sleep(pause);
                    pause *= 2;
                }
                Err(failure) if failure.retry => {
                    return Err(failed(format!(
                        "{} (after {attempts} tries)",
                        failure.reason
                    )))
                }
                Err(failure) => return Err(failed(failure.reason)),
            }
        }
        // A wrong file cannot be fixed by resuming it: it is deleted, the next try starts over.
        let size = fs::metadata(&partial).map_err(io_error(&partial))?.len();
        if let Some(expected) = file.size.filter(|&s| s != size) {
            fs::remove_file(&partial).map_err(io_error(&partial))?;
            return Err(failed(format!(
                "received {size} bytes, the registry pins {expected}"
            )));
        }
        let sha256 = sha256_file(&partial)?;
        if let Some(expected) = file.sha256.as_ref().filter(|&s| *s != sha256) {
            fs::remove_file(&partial).map_err(io_error(&partial))?;
            return Err(failed(format!(
                "checksum mismatch: received SHA-256 {sha256}, the registry pins {expected}"
            )));
        }
        fs::rename(&partial, path).map_err(io_error(path))?;
        let metadata = fs::metadata(path).map_err(io_error(path))?;
        Ok(Stamp::of(&metadata, sha256))
    }

    /// One HTTP request: appends to `partial` from where it ends.
    fn try_fetch(
        &self,
        url: &str,
        file: &FileEntry,
        partial: &Path,
        progress: &mut dyn Progress,
    ) -> std::result::Result<(), Failure> {
        let have = fs::metadata(partial).map_or(0, |m| m.len());
        if file.size.is_some_and(|size| have >= size) {
            return Ok(()); // complete (or too long): the verification decides
        }
        let mut request = self.agent.get(url);
        if let Some(token) = self.options.token.as_ref().filter(|_| file.on_hub()) {
            request = request.header("Authorization", format!("Bearer {token}"));
        }
        if have > 0 {
            request = request.header("Range", format!("bytes={have}-"));
        }
        let response = request.call().map_err(|e| Failure::retry(describe(&e)))?;
        let status = response.status().as_u16();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let length: Option<u64> = header("content-length").and_then(|v| v.parse().ok());
        let start = match status {
            200 => 0,
            206 => {
                let range_start = header("content-range")
                    .and_then(|v| v.strip_prefix("bytes ")?.split('-').next()?.parse().ok());
                if range_start != Some(have) {
                    // Not the range asked for: start the file over.
                    let _ = fs::remove_file(partial);
                    return Err(Failure::retry(format!(
                        "the server answered a range request with {:?}",
                        header("content-range")
                    )));
                }
                have
            }
            416 => {
                let _ = fs::remove_file(partial);
                return Err(Failure::retry(
                    "the partial download is longer than the file",
                ));
            }
            401 | 403 => {
                return Err(Failure::fatal(format!(
                    "access denied (HTTP {status}); for a gated model accept its licence on the \
                     Hub and set HF_TOKEN"
                )))
            }
            404 => return Err(Failure::fatal("not found (HTTP 404)")),
            429 | 500..=599 => return Err(Failure::retry(format!("HTTP {status}"))),
            _ => return Err(Failure::fatal(format!("unexpected HTTP {status}"))),
        };
        let mut out = OpenOptions::new()
            .create(true)
            .write(true)
            .append(start > 0)
            .truncate(start == 0)
            .open(partial)
            .map_err(|e| Failure::fatal(format!("{}: {e}", partial.display())))?;
        progress.start(file.local(), length.map(|l| start + l), start);
        let mut body = response.into_body().into_reader();
        let mut buffer = vec![0u8; 256 * 1024];
        loop {
            let n = match body.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => {
                    let _ = out.flush();
                    return Err(Failure::retry(format!("connection lost: {e}")));
                }
            };
            out.write_all(&buffer[..n])
                .map_err(|e| Failure::fatal(format!("{}: {e}", partial.display())))?;
            progress.advance(n as u64);
        }
        out.flush()
            .map_err(|e| Failure::fatal(format!("{}: {e}", partial.display())))?;
        Ok(())
    }
}

fn describe(error: &ureq::Error) -> String {
    match error {
        ureq::Error::Timeout(what) => format!("timed out ({what})"),
        other => other.to_string(),
    }
}
