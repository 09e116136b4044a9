//! Live captions: audio in, streaming Whisper, live re-translation (`engine-mt`: SSBD by
//! default, the previous caption drafting the next), caption updates out. Each partial
//! transcript is translated as it comes; the final one commits the utterance's caption.

use std::time::Duration;

use engine_mt::{Caption, LiveTranslator, StreamSummary};
use spec_voice::{Clock, ClockKind, Partial};

use crate::drive::Pipeline;
use crate::listener::{Heard, Listener};
use crate::Result;

/// Something that happened, at a time of the stream.
#[derive(Clone, Debug, PartialEq)]
pub struct CaptionEvent {
    pub at: Duration,
    pub kind: CaptionEventKind,
}

/// The kinds of [`CaptionEvent`].
#[derive(Clone, Debug, PartialEq)]
pub enum CaptionEventKind {
    /// Speech started (at `started_at`).
    SpeechStarted { started_at: Duration },
    /// A caption for the transcript `source` (final: the utterance is complete).
    Caption { source: String, caption: Caption },
    /// An utterance without words.
    NoWords,
}

impl std::fmt::Display for CaptionEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:>8.3} s  ", self.at.as_secs_f64())?;
        match &self.kind {
            CaptionEventKind::SpeechStarted { started_at } => {
                write!(f, "{:<10} (at {:.3} s)", "speech", started_at.as_secs_f64())
            }
            CaptionEventKind::Caption { source, caption } => {
                let what = if caption.is_final { "final" } else { "caption" };
                write!(f, "{what:<10} {:?} ← {source:?}", caption.display)
            }
            CaptionEventKind::NoWords => write!(f, "{:<10} (no words: ignored)", "noise"),
        }
    }
}

/// Captions of an audio stream: a [`Listener`] and a [`LiveTranslator`] on one clock.
pub struct LiveCaptions<'m> {
    listener: Listener,
    translator: LiveTranslator<'m>,
    clock: Clock,
    /// The transcript translated last in the current utterance.
    last_source: Option<String>,
    /// The current utterance's captions.
    utterance: Vec<Caption>,
    summary: StreamSummary,
    events: Vec<CaptionEvent>,
}

impl<'m> LiveCaptions<'m> {
    pub fn new(listener: Listener, translator: LiveTranslator<'m>, clock: ClockKind) -> Self {
        Self {
            listener,
            translator,
            clock: Clock::start(clock),
            last_source: None,
            utterance: Vec::new(),
            summary: StreamSummary::default(),
            events: Vec::new(),
        }
    }

    /// Totals over the completed utterances: output tokens, translation time, flicker
    /// (normalized erasure of what was displayed).
    pub fn summary(&self) -> &StreamSummary {
        &self.summary
    }

    /// Gives the listener back.
    pub fn into_listener(self) -> Listener {
        self.listener
    }

    fn translate(&mut self, transcript: Partial) -> Result<()> {
        let caption = self.translator.update(&transcript)?;
        let source = transcript.text;
        self.clock.charge(caption.decode.time);
        self.utterance.push(caption.clone());
        let at = self.clock.now();
        self.events.push(CaptionEvent {
            at,
            kind: CaptionEventKind::Caption {
                source: source.clone(),
                caption,
            },
        });
        self.last_source = Some(source);
        Ok(())
    }
}

impl Pipeline for LiveCaptions<'_> {
    type Event = CaptionEvent;

    fn clock(&self) -> &Clock {
        &self.clock
    }

    fn listener(&self) -> &Listener {
        &self.listener
    }

    fn listener_mut(&mut self) -> &mut Listener {
        &mut self.listener
    }

    /// Each new transcript is translated at once (nothing is left for steps).
    fn on_heard(&mut self, heard: Vec<Heard>) -> Result<()> {
        for item in heard {
            match item {
                // Captions end utterances at the detector's silence only: none resumes.
                Heard::Started { at: started_at } | Heard::Resumed { at: started_at, .. } => {
                    self.translator.reset();
                    self.last_source = None;
                    self.utterance.clear();
                    let at = self.clock.now();
                    self.events.push(CaptionEvent {
                        at,
                        kind: CaptionEventKind::SpeechStarted { started_at },
                    });
                }
                Heard::Partial(partial) => {
                    if !partial.text.trim().is_empty()
                        && self.last_source.as_deref() != Some(&partial.text)
                    {
                        self.translate(partial)?;
                    }
                }
                Heard::Final { transcript, .. } => {
                    if transcript.text.trim().is_empty() {
                        let at = self.clock.now();
                        self.events.push(CaptionEvent {
                            at,
                            kind: CaptionEventKind::NoWords,
                        });
                    } else {
                        self.translate(transcript)?;
                    }
                    let by_characters = self.translator.config().task.target_uses_characters();
                    if !self.utterance.is_empty() {
                        self.summary.add_sentence(&self.utterance, by_characters);
                    }
                    self.utterance.clear();
                    self.last_source = None;
                }
            }
        }
        Ok(())
    }

    fn take_events(&mut self) -> Vec<CaptionEvent> {
        std::mem::take(&mut self.events)
    }
}
