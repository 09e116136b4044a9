//! A [`Transcript`] written out: plain text, SubRip (`.srt`), WebVTT (`.vtt`) or JSON (the
//! segments with their times, and their words when word timestamps were asked for).

use std::fmt::Write as _;
use std::str::FromStr;

use crate::whisper::transcribe::Segment;
use crate::{Error, Transcript};

/// The formats a transcript is written in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum OutputFormat {
    /// The text, one line.
    #[default]
    Txt,
    /// SubRip subtitles: numbered cues, `HH:MM:SS,mmm --> HH:MM:SS,mmm`.
    Srt,
    /// WebVTT subtitles: a `WEBVTT` header, cues `HH:MM:SS.mmm --> HH:MM:SS.mmm`.
    Vtt,
    /// JSON: the text, the language and the timed segments (with their words, if any).
    Json,
}

impl OutputFormat {
    /// Every format, in the order of [`OutputFormat::extension`]'s names.
    pub const ALL: [OutputFormat; 4] = [Self::Txt, Self::Srt, Self::Vtt, Self::Json];

    /// The file extension (and the format's name): `txt`, `srt`, `vtt`, `json`.
    pub fn extension(self) -> &'static str {
        match self {
            Self::Txt => "txt",
            Self::Srt => "srt",
            Self::Vtt => "vtt",
            Self::Json => "json",
        }
    }

    /// Whether the format shows segment times (the transcript must then be decoded with
    /// timestamps).
    pub fn needs_timestamps(self) -> bool {
        self != Self::Txt
    }

    /// `transcript` in this format.
    pub fn render(self, transcript: &Transcript) -> String {
        match self {
            Self::Txt => to_text(transcript),
            Self::Srt => to_srt(&transcript.segments),
            Self::Vtt => to_vtt(&transcript.segments),
            Self::Json => to_json(transcript),
        }
    }
}

impl FromStr for OutputFormat {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self, Error> {
        Self::ALL
            .into_iter()
            .find(|f| f.extension().eq_ignore_ascii_case(name))
            .ok_or_else(|| {
                Error::Config(format!(
                    "output format `{name}` is not one of txt, srt, vtt, json"
                ))
            })
    }
}

impl std::fmt::Display for OutputFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.extension())
    }
}

/// The transcript's text and a newline.
pub fn to_text(transcript: &Transcript) -> String {
    format!("{}\n", transcript.text.trim())
}

/// `seconds` as `HH:MM:SS` and milliseconds after `separator` (`,` in SubRip, `.` in WebVTT),
/// rounded to the nearest millisecond. Hours go past 99 if they must; a negative or NaN time
/// is 0.
pub fn timestamp(seconds: f64, separator: char) -> String {
    let millis = if seconds.is_finite() && seconds > 0.0 {
        (seconds * 1000.0).round() as u64
    } else if seconds == f64::INFINITY {
        u64::MAX / 2
    } else {
        0
    };
    let (h, m, s, ms) = (
        millis / 3_600_000,
        millis / 60_000 % 60,
        millis / 1000 % 60,
        millis % 1000,
    );
    format!("{h:02}:{m:02}:{s:02}{separator}{ms:03}")
}

/// A segment's text as one cue line: whitespace (newlines included, which would end a cue)
/// folded to single spaces, and `-->` (which would read as a timing line) broken up.
fn cue_text(text: &str) -> String {
    let folded = text.split_whitespace().collect::<Vec<_>>().join(" ");
    folded.replace("-->", "->")
}

/// The cues of `segments`: their start and end times (an end before its start is moved to the
/// start) and their text; segments without text are left out.
fn cues(segments: &[Segment]) -> impl Iterator<Item = (f64, f64, String)> + '_ {
    segments.iter().filter_map(|segment| {
        let text = cue_text(&segment.text);
        let start = f64::from(segment.start);
        let end = f64::from(segment.end).max(start);
        (!text.is_empty()).then_some((start, end, text))
    })
}

/// SubRip subtitles: cues numbered from 1, `HH:MM:SS,mmm --> HH:MM:SS,mmm`, a blank line after
/// each. No segments give an empty file.
pub fn to_srt(segments: &[Segment]) -> String {
    let mut out = String::new();
    for (i, (start, end, text)) in cues(segments).enumerate() {
        let _ = write!(
            out,
            "{}\n{} --> {}\n{text}\n\n",
            i + 1,
            timestamp(start, ','),
            timestamp(end, ',')
        );
    }
    out
}

/// WebVTT subtitles: the `WEBVTT` header, then cues `HH:MM:SS.mmm --> HH:MM:SS.mmm`, their text
/// with `&`, `<` and `>` escaped (WebVTT reads them as markup).
pub fn to_vtt(segments: &[Segment]) -> String {
    let mut out = String::from("WEBVTT\n\n");
    for (start, end, text) in cues(segments) {
        let text = text
            .replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;");
        let _ = write!(
            out,
            "{} --> {}\n{text}\n\n",
            timestamp(start, '.'),
            timestamp(end, '.')
        );
    }
    out
}

/// The transcript as JSON: `text`, `language` (`null` when unknown) and `segments`, each with
/// `id`, `start`, `end` (seconds), `text`, `tokens`, `temperature`, `avg_logprob`,
/// `compression_ratio`, `no_speech_prob`, and `words` (`start`, `end`, `word`, `probability`)
/// when the segment has its words timed. Pretty-printed, with a final newline.
pub fn to_json(transcript: &Transcript) -> String {
    let segments: Vec<serde_json::Value> = transcript
        .segments
        .iter()
        .enumerate()
        .map(|(id, s)| {
            let mut segment = serde_json::json!({
                "id": id,
                "start": number(s.start),
                "end": number(s.end),
                "text": s.text.trim(),
                "tokens": s.tokens,
                "temperature": number(s.temperature),
                "avg_logprob": number(s.avg_logprob),
                "compression_ratio": number(s.compression_ratio),
                "no_speech_prob": number(s.no_speech_probability),
            });
            if !s.words.is_empty() {
                segment["words"] = s
                    .words
                    .iter()
                    .map(|w| {
                        serde_json::json!({
                            "start": number(w.start),
                            "end": number(w.end),
                            "word": w.word,
                            "probability": number(w.probability),
                        })
                    })
                    .collect();
            }
            segment
        })
        .collect();
    let json = serde_json::json!({
        "text": transcript.text.trim(),
        "language": transcript.language,
        "segments": segments,
    });
    let mut text = serde_json::to_string_pretty(&json).expect("JSON values always serialize");
    text.push('\n');
    text
}

/// `value` as the shortest decimal that reads back as the same `f32` (1.12, not the
/// 1.1200000047683716 of its `f64` widening); `null` if it is not finite.
fn number(value: f32) -> serde_json::Value {
    value
        .to_string()
        .parse::<f64>()
        .ok()
        .and_then(serde_json::Number::from_f64)
        .map_or(serde_json::Value::Null, serde_json::Value::Number)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::whisper::Word;

    fn segment(start: f32, end: f32, text: &str) -> Segment {
        Segment {
            start,
            end,
            text: text.into(),
            tokens: vec![1, 2],
            temperature: 0.0,
            avg_logprob: -0.25,
            compression_ratio: 1.5,
            no_speech_probability: 0.01,
            words: Vec::new(),
        }
    }

    fn transcript(segments: Vec<Segment>) -> Transcript {
        Transcript {
            text: segments.iter().map(|s| s.text.as_str()).collect(),
            segments,
            language: Some("en".into()),
            stats: Default::default(),
        }
    }

    #[test]
    fn timestamps_round_to_the_millisecond_and_pass_an_hour() {
        assert_eq!(timestamp(0.0, ','), "00:00:00,000");
        assert_eq!(timestamp(1.0004, ','), "00:00:01,000");
        assert_eq!(timestamp(1.0005, '.'), "00:00:01.001");
        assert_eq!(timestamp(59.9996, '.'), "00:01:00.000");
        assert_eq!(timestamp(3599.9994, ','), "00:59:59,999");
        assert_eq!(timestamp(3725.5, ','), "01:02:05,500");
        assert_eq!(timestamp(100.0 * 3600.0 + 1.25, '.'), "100:00:01.250");
        assert_eq!(timestamp(-2.0, ','), "00:00:00,000");
        assert_eq!(timestamp(f64::NAN, ','), "00:00:00,000");
        // An f32 segment time (62.04 is 62.0400009…) keeps its millisecond.
        assert_eq!(timestamp(f64::from(62.04f32), ','), "00:01:02,040");
    }

    #[test]
    fn srt_numbers_its_cues_and_vtt_has_its_header() {
        let segments = vec![
            segment(0.0, 2.5, " Hello there."),
            segment(62.04, 3725.5, " Bye."),
        ];
        assert_eq!(
            to_srt(&segments),
            "1\n00:00:00,000 --> 00:00:02,500\nHello there.\n\n\
             2\n00:01:02,040 --> 01:02:05,500\nBye.\n\n"
        );
        assert_eq!(
            to_vtt(&segments),
            "WEBVTT\n\n00:00:00.000 --> 00:00:02.500\nHello there.\n\n\
             00:01:02.040 --> 01:02:05.500\nBye.\n\n"
        );
    }

    #[test]
    fn cue_text_cannot_break_the_cue() {
        let segments = vec![
            segment(1.0, 2.0, " a --> b\n\nc\r\nd "),
            segment(2.0, 3.0, " \n "),
            segment(4.0, 3.5, " <i>x</i> & y"),
        ];
        let srt = to_srt(&segments);
        assert_eq!(
            srt,
            "1\n00:00:01,000 --> 00:00:02,000\na -> b c d\n\n\
             2\n00:00:04,000 --> 00:00:04,000\n<i>x</i> & y\n\n"
        );
        let vtt = to_vtt(&segments);
        assert_eq!(
            vtt,
            "WEBVTT\n\n00:00:01.000 --> 00:00:02.000\na -&gt; b c d\n\n\
             00:00:04.000 --> 00:00:04.000\n&lt;i&gt;x&lt;/i&gt; &amp; y\n\n"
        );
        // Each cue is its timing line and one line of text: `-->` only in timing lines.
        for (file, header) in [(&srt, 0), (&vtt, 1)] {
            let blocks: Vec<&str> = file.trim_end().split("\n\n").skip(header).collect();
            assert_eq!(blocks.len(), 2);
            for block in blocks {
                let lines: Vec<&str> = block.lines().collect();
                let timing = lines.iter().filter(|l| l.contains("-->")).count();
                assert_eq!((timing, lines.len()), (1, 2 + usize::from(header == 0)));
            }
        }
    }

    #[test]
    fn an_empty_transcript_is_an_empty_file_of_each_format() {
        let empty = transcript(Vec::new());
        assert_eq!(OutputFormat::Txt.render(&empty), "\n");
        assert_eq!(OutputFormat::Srt.render(&empty), "");
        assert_eq!(OutputFormat::Vtt.render(&empty), "WEBVTT\n\n");
        let json: serde_json::Value =
            serde_json::from_str(&OutputFormat::Json.render(&empty)).unwrap();
        assert_eq!(json["text"], "");
        assert_eq!(json["segments"].as_array().unwrap().len(), 0);
    }

    #[test]
    fn json_holds_the_segments_times_and_words() {
        let mut first = segment(0.5, 1.75, " One two.");
        first.words = vec![
            Word {
                start: 0.5,
                end: 1.0,
                word: " One".into(),
                probability: 0.9,
            },
            Word {
                start: 1.0,
                end: 1.75,
                word: " two.".into(),
                probability: 0.8,
            },
        ];
        let t = transcript(vec![first, segment(4000.0, 4001.5, " Three.")]);
        let json: serde_json::Value = serde_json::from_str(&to_json(&t)).unwrap();
        assert_eq!(json["text"], "One two. Three.");
        assert_eq!(json["language"], "en");
        let segments = json["segments"].as_array().unwrap();
        assert_eq!(segments.len(), 2);
        assert_eq!(segments[0]["start"], 0.5);
        assert_eq!(segments[0]["end"], 1.75);
        assert_eq!(segments[1]["start"], 4000.0);
        assert_eq!(segments[1]["text"], "Three.");
        assert_eq!(segments[1]["id"], 1);
        assert_eq!(segments[0]["tokens"], serde_json::json!([1, 2]));
        let words = segments[0]["words"].as_array().unwrap();
        assert_eq!(words.len(), 2);
        assert_eq!(words[1]["word"], " two.");
        assert_eq!(words[1]["start"], 1.0);
        assert!((words[0]["probability"].as_f64().unwrap() - 0.9).abs() < 1e-6);
        assert!(segments[1].get("words").is_none());
        // f32 times and scores as their shortest decimals, exact once read back as f32.
        let mut odd = segment(1.12, 62.04, " x");
        odd.avg_logprob = f32::NAN;
        let text = to_json(&transcript(vec![odd]));
        assert!(
            text.contains("\"start\": 1.12,") && text.contains("\"end\": 62.04,"),
            "{text}"
        );
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            json["segments"][0]["start"].as_f64().unwrap() as f32,
            1.12f32
        );
        assert!(json["segments"][0]["avg_logprob"].is_null());
    }

    #[test]
    fn format_names_parse_and_say_which_need_timestamps() {
        for format in OutputFormat::ALL {
            assert_eq!(format.extension().parse::<OutputFormat>().unwrap(), format);
            assert_eq!(format.to_string(), format.extension());
            assert_eq!(format.needs_timestamps(), format != OutputFormat::Txt);
        }
        assert_eq!("SRT".parse::<OutputFormat>().unwrap(), OutputFormat::Srt);
        assert!(matches!(
            "docx".parse::<OutputFormat>(),
            Err(Error::Config(_))
        ));
    }
}
