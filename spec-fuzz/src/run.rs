//! The fuzzing loop of one target: seeds, then mutations of the corpus for a time or a number
//! of cases. An input whose parse ends in a way no earlier input's did (the steps it reached
//! and their errors, numbers and quoted names left out) joins the corpus, so the mutations
//! work from inputs that reach further. Panics and memory beyond the target's limit are
//! findings, saved with their input; a parse running past the time limit ends the process, its
//! input on disk.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::alloc;
use crate::mutate::{mutate, Material};
use crate::rng::Rng;
use crate::targets::Target;

/// Most inputs a target's corpus grows to.
const MAX_CORPUS: usize = 512;
/// Findings kept per target; later ones of a target are counted, not saved.
pub const MAX_FINDINGS: usize = 16;

/// How long and how to fuzz.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Time per target.
    pub duration: Duration,
    /// Stop a target after this many cases, if sooner.
    pub max_cases: Option<u64>,
    pub seed: u64,
    /// Where the findings go (`findings/`).
    pub out: PathBuf,
    /// Where each target's working folder goes: every case writes its input there, so a
    /// memory file system (`/dev/shm`) makes fuzzing many times faster than a disk.
    pub work: PathBuf,
    /// A parse running longer than this is a hang.
    pub timeout: Duration,
    /// Extra seeds: the files of `corpus/<target>/`.
    pub corpus: Option<PathBuf>,
}

/// A crash, a hang-free failure or a memory overrun, with the input that caused it.
#[derive(Debug)]
pub struct Finding {
    pub kind: &'static str,
    pub message: String,
    pub input: PathBuf,
}

/// What a target's run did.
#[derive(Debug)]
pub struct Report {
    pub target: &'static str,
    pub cases: u64,
    pub elapsed: Duration,
    pub corpus: usize,
    /// Distinct ways parses ended.
    pub outcomes: usize,
    /// Most bytes a parse held at once, relative to its input's length plus one.
    pub worst_memory_per_byte: f64,
    pub findings: Vec<Finding>,
    /// Findings past [`MAX_FINDINGS`] or repeating an earlier one.
    pub repeated_findings: u64,
}

/// The message of the last panic, recorded by the hook [`fuzz`] installs.
static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);

/// Fuzzes `target` as `settings` say.
pub fn fuzz(target: &Target, settings: &Settings) -> Result<Report> {
    let work = settings.work.join(target.name);
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let findings_dir = settings.out.join("findings");
    std::fs::create_dir_all(&findings_dir)?;
    (target.prepare)(&work).with_context(|| format!("preparing {}", target.name))?;
    let mut corpus = (target.seeds)(&work).with_context(|| format!("seeds of {}", target.name))?;
    if let Some(dir) = &settings.corpus {
        corpus.extend(read_corpus(&dir.join(target.name))?);
    }
    let seeds = corpus.len();
    std::panic::set_hook(Box::new(|info| {
        let message = match info.payload().downcast_ref::<&str>() {
            Some(text) => text.to_string(),
            None => info
                .payload()
                .downcast_ref::<String>()
                .cloned()
                .unwrap_or_default(),
        };
        let place = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        if let Ok(mut last) = LAST_PANIC.lock() {
            *last = Some(format!("{message}{place}"));
        }
    }));
    let current = work.join("current-input");
    let watchdog = Watchdog::start(target.name, current.clone(), settings.timeout);
    let mut state = State {
        target,
        work: &work,
        findings_dir: &findings_dir,
        current: &current,
        outcomes: HashSet::new(),
        findings: Vec::new(),
        seen_findings: HashSet::new(),
        repeated_findings: 0,
        worst_memory_per_byte: 0.0,
        watchdog: &watchdog,
    };
    let started = Instant::now();
    let mut cases = 0;
    for seed in corpus.clone() {
        state.run(&seed, &mut corpus)?;
        cases += 1;
    }
    let mut rng = Rng::new(settings.seed ^ hash(target.name.as_bytes()));
    let mut input = Vec::new();
    while started.elapsed() < settings.duration && settings.max_cases.is_none_or(|max| cases < max)
    {
        // Recent additions reach furthest: half the picks come from the newer half.
        let base = match rng.one_in(2) && corpus.len() > seeds {
            true => seeds + rng.below(corpus.len() - seeds),
            false => rng.below(corpus.len()),
        };
        input.clone_from(&corpus[base]);
        let material = Material {
            corpus: &corpus,
            dictionary: target.dictionary,
            max_len: target.max_len,
        };
        mutate(&mut rng, &mut input, &material);
        state.run(&input, &mut corpus)?;
        cases += 1;
    }
    let elapsed = started.elapsed();
    let State {
        outcomes,
        findings,
        repeated_findings,
        worst_memory_per_byte,
        ..
    } = state;
    watchdog.stop();
    let _ = std::panic::take_hook();
    Ok(Report {
        target: target.name,
        cases,
        elapsed,
        corpus: corpus.len(),
        outcomes: outcomes.len(),
        worst_memory_per_byte,
        findings,
        repeated_findings,
    })
}

struct State<'a> {
    target: &'a Target,
    work: &'a Path,
    findings_dir: &'a Path,
    current: &'a Path,
    outcomes: HashSet<u64>,
    findings: Vec<Finding>,
    seen_findings: HashSet<u64>,
    repeated_findings: u64,
    worst_memory_per_byte: f64,
    watchdog: &'a Watchdog,
}

impl State<'_> {
    /// Runs one case, growing the corpus with it when it ends a new way.
    fn run(&mut self, input: &[u8], corpus: &mut Vec<Vec<u8>>) -> Result<()> {
        std::fs::write(self.current, input)
            .with_context(|| format!("writing {}", self.current.display()))?;
        self.watchdog.begin();
        let (result, peak) = alloc::watch(|| {
            std::panic::catch_unwind(AssertUnwindSafe(|| (self.target.parse)(self.work, input)))
        });
        self.watchdog.end();
        let per_byte = peak as f64 / (input.len() + 1) as f64;
        self.worst_memory_per_byte = self.worst_memory_per_byte.max(per_byte);
        let limit = self.target.memory_limit(input.len());
        match result {
            Err(_) => {
                let message = LAST_PANIC
                    .lock()
                    .ok()
                    .and_then(|mut last| last.take())
                    .unwrap_or_default();
                self.found("panic", message, input)?;
            }
            Ok(_) if peak > limit => {
                let message = format!(
                    "held {peak} bytes at once for an input of {} bytes (limit {limit})",
                    input.len()
                );
                self.found("memory", message, input)?;
            }
            Ok(trace) => {
                let outcome = hash(normalize(&trace.summary(), self.work).as_bytes());
                if self.outcomes.insert(outcome) && corpus.len() < MAX_CORPUS {
                    corpus.push(input.to_vec());
                }
            }
        }
        Ok(())
    }

    fn found(&mut self, kind: &'static str, message: String, input: &[u8]) -> Result<()> {
        let key = hash(format!("{kind}{}", normalize(&message, self.work)).as_bytes());
        if !self.seen_findings.insert(key) || self.findings.len() >= MAX_FINDINGS {
            self.repeated_findings += 1;
            return Ok(());
        }
        let path = self.findings_dir.join(format!(
            "{}-{kind}-{:016x}.bin",
            self.target.name,
            hash(input)
        ));
        std::fs::write(&path, input).with_context(|| format!("writing {}", path.display()))?;
        eprintln!(
            "{}: {kind}: {message}\n  input saved as {}",
            self.target.name,
            path.display()
        );
        self.findings.push(Finding {
            kind,
            message,
            input: path,
        });
        Ok(())
    }
}

/// `text` without the working folder's path, digits and quoted names: what stays the same
/// when the same check refuses different inputs.
fn normalize(text: &str, work: &Path) -> String {
    let text = text.replace(&*work.to_string_lossy(), "");
    let mut out = String::with_capacity(text.len());
    let mut quote: Option<char> = None;
    for c in text.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if matches!(c, '`' | '"' | '\'') => {
                quote = Some(c);
                out.push(c);
            }
            None if c.is_ascii_digit() => {}
            None => out.push(c),
        }
    }
    out
}

fn hash(bytes: &[u8]) -> u64 {
    let mut hasher = DefaultHasher::new();
    bytes.hash(&mut hasher);
    hasher.finish()
}

fn read_corpus(dir: &Path) -> Result<Vec<Vec<u8>>> {
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    files.sort();
    files
        .iter()
        .filter(|path| path.is_file())
        .map(|path| std::fs::read(path).with_context(|| format!("reading {}", path.display())))
        .collect()
}

/// Ends the process when one case runs past the time limit.
struct Watchdog {
    /// Milliseconds since `origin` at which the running case began; 0 when none runs.
    began: Arc<AtomicU64>,
    origin: Instant,
    stop: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    fn start(target: &'static str, current: PathBuf, timeout: Duration) -> Self {
        let began = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicU64::new(0));
        let origin = Instant::now();
        let thread = {
            let (began, stop) = (began.clone(), stop.clone());
            std::thread::spawn(move || {
                while stop.load(Ordering::Relaxed) == 0 {
                    std::thread::sleep(Duration::from_millis(50));
                    let at = began.load(Ordering::Relaxed);
                    let now = origin.elapsed().as_millis() as u64;
                    if at > 0 && now.saturating_sub(at) > timeout.as_millis() as u64 {
                        eprintln!(
                            "{target}: hang: a parse ran past {timeout:?}; its input is {}",
                            current.display()
                        );
                        std::process::exit(3);
                    }
                }
            })
        };
        Self {
            began,
            origin,
            stop,
            thread: Some(thread),
        }
    }

    fn begin(&self) {
        let now = self.origin.elapsed().as_millis() as u64;
        self.began.store(now.max(1), Ordering::Relaxed);
    }

    fn end(&self) {
        self.began.store(0, Ordering::Relaxed);
    }

    fn stop(mut self) {
        self.stop.store(1, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::normalize;
    use std::path::Path;

    #[test]
    fn outcomes_differing_in_numbers_and_names_are_one() {
        let work = Path::new("/tmp/w");
        assert_eq!(
            normalize("open:/tmp/w/a.bin: `x.y` holds 12 bytes ", work),
            normalize("open:/tmp/w/a.bin: `zz` holds 7 bytes ", work)
        );
        assert_ne!(
            normalize("open:truncated ", work),
            normalize("open:not UTF-8 ", work)
        );
    }
}
