//! The voices a server's chat sessions speak with: the server's own, and the others a client
//! may name in its `start`. Each is loaded the first time a session picks it and then shared by
//! every session that picks it; a few stay loaded (each is a model in memory), the least
//! recently picked is let go beyond that.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use super::SynthesizerFactory;
use crate::{Error, Result};

/// Loads a voice by name (a name the server offers), for [`Voices::with_choices`].
pub type VoiceLoader = Arc<dyn Fn(&str) -> spec_voice::Result<SynthesizerFactory> + Send + Sync>;

/// Most voices kept loaded besides the server's own.
pub const KEPT_VOICES: usize = 3;

/// The server's voice and the voices its clients may pick.
#[derive(Clone)]
pub struct Voices {
    default_name: String,
    default: SynthesizerFactory,
    /// Every name a client may pick, the server's own among them.
    names: Arc<[String]>,
    loader: Option<VoiceLoader>,
    /// Voices loaded for the sessions that named them, the most recently picked last.
    loaded: Arc<Mutex<VecDeque<(String, SynthesizerFactory)>>>,
}

impl Voices {
    /// The server's voice alone, called `name`.
    pub fn new(name: impl Into<String>, default: SynthesizerFactory) -> Self {
        let default_name = name.into();
        Self {
            names: Arc::from([default_name.clone()]),
            default_name,
            default,
            loader: None,
            loaded: Arc::default(),
        }
    }

    /// Also offers `names`, each loaded by `loader` when a session first picks it.
    pub fn with_choices(mut self, names: Vec<String>, loader: VoiceLoader) -> Self {
        let mut all = names;
        if !all.contains(&self.default_name) {
            all.insert(0, self.default_name.clone());
        }
        self.names = all.into();
        self.loader = Some(loader);
        self
    }

    /// The name of the voice a session speaks with when it names none.
    pub fn default_name(&self) -> &str {
        &self.default_name
    }

    /// The names a client may pick.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    pub fn offers(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name)
    }

    /// The voice called `name` (`None`: the server's own), loaded if no session holds it now.
    pub(crate) fn get(&self, name: Option<&str>) -> Result<SynthesizerFactory> {
        let name = match name {
            Some(name) if name != self.default_name => name,
            _ => return Ok(Arc::clone(&self.default)),
        };
        let loader = self
            .loader
            .as_ref()
            .filter(|_| self.offers(name))
            .ok_or_else(|| Error::Input(format!("the server offers no voice `{name}`")))?;
        // Held while loading, so that sessions picking the same new voice load it once.
        let mut loaded = self
            .loaded
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let factory = match loaded.iter().position(|(n, _)| n == name) {
            Some(i) => loaded.remove(i).map(|(_, factory)| factory),
            None => None,
        };
        let factory = match factory {
            Some(factory) => factory,
            None => {
                tracing::info!("loading the voice {name}");
                loader(name)?
            }
        };
        loaded.push_back((name.to_string(), Arc::clone(&factory)));
        while loaded.len() > KEPT_VOICES {
            loaded.pop_front();
        }
        Ok(factory)
    }
}

impl From<SynthesizerFactory> for Voices {
    /// The one voice `factory` makes, called `default`.
    fn from(factory: SynthesizerFactory) -> Self {
        Self::new("default", factory)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use spec_voice::FixedLatencySynthesizer;

    use super::*;
    use crate::serve::copies_of;

    fn fixed() -> SynthesizerFactory {
        copies_of(FixedLatencySynthesizer::default())
    }

    #[test]
    fn voices_load_once_are_shared_and_the_least_recent_is_let_go() {
        let loads = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&loads);
        let names: Vec<String> = ["a", "b", "c", "d", "own"].map(String::from).into();
        let voices = Voices::new("own", fixed()).with_choices(
            names,
            Arc::new(move |_| {
                counted.fetch_add(1, Ordering::SeqCst);
                Ok(fixed())
            }),
        );
        assert_eq!(voices.names(), ["a", "b", "c", "d", "own"]);
        // The server's own voice, by name or by default, is never loaded.
        let own = voices.get(None).unwrap();
        assert!(Arc::ptr_eq(&own, &voices.get(Some("own")).unwrap()));
        assert_eq!(loads.load(Ordering::SeqCst), 0);

        let a = voices.get(Some("a")).unwrap();
        assert!(Arc::ptr_eq(&a, &voices.get(Some("a")).unwrap()));
        assert_eq!(loads.load(Ordering::SeqCst), 1);
        for name in ["b", "c", "a", "d"] {
            voices.get(Some(name)).unwrap();
        }
        // `b` was picked least recently of the four: it was let go, `a` was kept.
        assert_eq!(loads.load(Ordering::SeqCst), 4);
        assert!(Arc::ptr_eq(&a, &voices.get(Some("a")).unwrap()));
        voices.get(Some("b")).unwrap();
        assert_eq!(loads.load(Ordering::SeqCst), 5);

        assert!(matches!(voices.get(Some("zz")), Err(Error::Input(_))));
        let alone = Voices::from(fixed());
        assert_eq!(alone.names(), ["default"]);
        assert!(alone.get(Some("a")).is_err());
    }
}
