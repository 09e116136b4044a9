//! The voice pipeline on tiny random-weight models: a random Whisper hears tone bursts as
//! random words, a random chat model answers them. What is tested is the plumbing: endpoints,
//! clocks, turns, that PredGen answers exactly as the cascade does from the same audio, and
//! that live captions commit the translation of the final transcript.

use std::time::Duration;

use engine_asr::testing::write_hf;
use engine_asr::{LoadOptions, TranscribeOptions, Transcriber};
use engine_llm::predgen::EventKind;
use engine_llm::testing::tiny_chat_model;
use engine_llm::{LanguageModel, Message, PredGen};
use engine_mt::{LiveConfig, LiveTranslator};
use spec_voice::{Clock, FixedLatencySynthesizer};
use specvoice::{
    play_recording, utterances_of, CaptionEventKind, ChatEvent, ChatEventKind, ChatMode, ClockKind,
    Error, Heard, Listener, ListenerConfig, LiveCaptions, Pipeline, SemanticTurnEnd, TurnEnd,
    VoiceChat, VoiceTurn,
};

mod common;

use common::{random_listener_config, random_predgen_config, silence, voice};

fn transcriber(dir: &tempfile::TempDir) -> Transcriber {
    Transcriber::load(dir.path(), &LoadOptions::default()).unwrap()
}

fn listener(transcriber: Transcriber) -> Listener {
    Listener::new(transcriber, random_listener_config()).unwrap()
}

fn predgen(model: &mut LanguageModel) -> PredGen<'_> {
    PredGen::new(model, random_predgen_config()).unwrap()
}

/// Plays `audio` through a fresh conversation in `mode`: the turns and every event.
fn converse(
    whisper: Transcriber,
    model: &mut LanguageModel,
    mode: ChatMode,
    clock: ClockKind,
    audio: &[f32],
) -> (Vec<VoiceTurn>, Vec<ChatEvent>, Transcriber) {
    let mut chat = VoiceChat::new(
        listener(whisper),
        predgen(model),
        Box::new(FixedLatencySynthesizer::default()),
        mode,
        clock,
    );
    let mut events = Vec::new();
    let turns = chat
        .play(audio, Duration::from_secs(1), &mut |e| {
            events.push(e.clone());
        })
        .unwrap();
    let (listener, _) = chat.into_parts();
    (turns, events, listener.into_transcriber())
}

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

#[test]
fn predgen_answers_as_the_cascade_does_from_the_same_audio() {
    let dir = tempfile::tempdir().unwrap();
    write_hf(dir.path(), 31).unwrap();
    let mut model = tiny_chat_model(11).unwrap();
    let audio = [silence(0.5), voice(1.2)].concat();
    let (cascade, _, whisper) = converse(
        transcriber(&dir),
        &mut model,
        ChatMode::Cascade,
        ClockKind::Simulated,
        &audio,
    );
    let (predgen, events, _) = converse(
        whisper,
        &mut model,
        ChatMode::PredGen,
        ClockKind::Simulated,
        &audio,
    );
    assert_eq!(cascade.len(), 1);
    assert_eq!(predgen.len(), 1);
    let (c, p) = (&cascade[0], &predgen[0]);
    assert!(!c.turn.question.is_empty());
    assert_eq!(p.turn.question, c.turn.question);
    assert_eq!(p.turn.answer, c.turn.answer);
    // Both heard the same audio: the same endpoints.
    for turn in [c, p] {
        assert_eq!(turn.speech_start, ms(500));
        assert_eq!(turn.speech_end, ms(1700));
        assert_eq!(turn.endpoint_at, ms(2200));
        assert!(turn.transcript_at >= turn.endpoint_at);
        assert!(turn.first_words_at >= turn.transcript_at);
        assert!(turn.first_audio_at >= turn.transcript_at);
        assert!(turn.audio().count() > 0, "{:?}", turn.turn);
        let parts = turn.breakdown();
        assert_eq!(parts.endpointing, ms(500));
        assert_eq!(
            parts.endpointing + parts.asr + parts.llm + parts.tts,
            turn.latency(),
            "{parts:?}"
        );
    }
    // The cascade synthesizes after the first sentence: at least the synthesizer's latency.
    assert!(c.breakdown().tts >= ms(200));
    // The pipeline's events in order of time (the model's "audio starts" is stamped with when
    // the audio plays), partials while the user speaks, the transcript after the end.
    let pipeline: Vec<&ChatEvent> = events
        .iter()
        .filter(|e| !matches!(e.kind, ChatEventKind::Answer(_)))
        .collect();
    assert!(
        pipeline.windows(2).all(|w| w[0].at <= w[1].at),
        "{pipeline:#?}"
    );
    let position =
        |wanted: fn(&ChatEventKind) -> bool| events.iter().position(|e| wanted(&e.kind)).unwrap();
    let started = position(|k| matches!(k, ChatEventKind::SpeechStarted { .. }));
    let partial = position(|k| matches!(k, ChatEventKind::Partial { .. }));
    let ended = position(|k| matches!(k, ChatEventKind::SpeechEnded { .. }));
    let transcript = position(|k| matches!(k, ChatEventKind::Transcript { .. }));
    let done = position(|k| matches!(k, ChatEventKind::TurnDone(_)));
    assert!(started < partial && partial < ended && ended < transcript && transcript < done);
    assert!(events[partial].at < p.speech_end + ms(100));
}

#[test]
fn two_questions_make_two_turns_of_one_conversation() {
    let dir = tempfile::tempdir().unwrap();
    write_hf(dir.path(), 32).unwrap();
    let mut model = tiny_chat_model(6).unwrap();
    let audio = [silence(0.3), voice(0.8), silence(3.0), voice(0.6)].concat();
    let mut chat = VoiceChat::new(
        listener(transcriber(&dir)),
        predgen(&mut model),
        Box::new(FixedLatencySynthesizer::default()),
        ChatMode::PredGen,
        ClockKind::Simulated,
    );
    let turns = chat.play(&audio, ms(800), &mut |_| {}).unwrap();
    assert_eq!(turns.len(), 2);
    assert_eq!(turns[0].speech_start, ms(300));
    assert_eq!(turns[1].speech_start, ms(4100));
    let (_, session) = chat.into_parts();
    assert_eq!(session.history().len(), 4);
    assert_eq!(session.history()[2].content, turns[1].turn.question);
}

#[test]
fn silence_and_noise_make_no_turn() {
    let dir = tempfile::tempdir().unwrap();
    write_hf(dir.path(), 33).unwrap();
    let mut model = tiny_chat_model(7).unwrap();
    // A steady hum from the start is the noise floor, and a click is too short to be speech.
    let hum: Vec<f32> = (0..48_000)
        .map(|i| 0.01 * (i as f32 * 0.05).sin())
        .collect();
    let click: Vec<f32> = voice(0.04).iter().map(|s| s * 2.0).collect();
    let audio = [hum, click, silence(1.0)].concat();
    let (turns, events, _) = converse(
        transcriber(&dir),
        &mut model,
        ChatMode::PredGen,
        ClockKind::Simulated,
        &audio,
    );
    assert!(turns.is_empty());
    assert!(events.is_empty(), "{events:?}");
}

#[test]
fn a_recording_played_in_real_time_is_answered_as_on_the_simulated_clock() {
    let dir = tempfile::tempdir().unwrap();
    write_hf(dir.path(), 34).unwrap();
    let mut model = tiny_chat_model(8).unwrap();
    let audio = [silence(0.3), voice(0.7)].concat();
    let (simulated, _, whisper) = converse(
        transcriber(&dir),
        &mut model,
        ChatMode::PredGen,
        ClockKind::Simulated,
        &audio,
    );
    let started = std::time::Instant::now();
    let (live, events, _) = converse(
        whisper,
        &mut model,
        ChatMode::PredGen,
        ClockKind::Wall,
        &audio,
    );
    // 1 s of audio and 1 s of trailing silence, played in real time.
    assert!(started.elapsed() >= ms(1500));
    assert_eq!(live.len(), 1);
    assert_eq!(live[0].turn.question, simulated[0].turn.question);
    assert_eq!(live[0].turn.answer, simulated[0].turn.answer);
    assert_eq!(live[0].speech_end, simulated[0].speech_end);
    // Events are stamped with the wall clock as they happen.
    let transcript = events
        .iter()
        .find(|e| matches!(e.kind, ChatEventKind::Transcript { .. }))
        .unwrap();
    assert!(transcript.at >= live[0].endpoint_at);
}

#[test]
fn bad_audio_and_settings_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_hf(dir.path(), 35).unwrap();
    let mut model = tiny_chat_model(9).unwrap();
    let mut chat = VoiceChat::new(
        listener(transcriber(&dir)),
        predgen(&mut model),
        Box::new(FixedLatencySynthesizer::default()),
        ChatMode::PredGen,
        ClockKind::Simulated,
    );
    assert!(matches!(
        chat.play(&[], ms(500), &mut |_| {}),
        Err(Error::Input(_))
    ));
    assert!(matches!(
        chat.hear_audio(&[0.1, f32::NAN]),
        Err(Error::Input(_))
    ));
    let (listener, _) = chat.into_parts();
    let beam = ListenerConfig {
        transcribe: TranscribeOptions {
            beam_size: 5,
            ..TranscribeOptions::default()
        },
        ..ListenerConfig::default()
    };
    assert!(matches!(
        Listener::new(listener.into_transcriber(), beam),
        Err(Error::Config(_))
    ));
}

#[test]
fn live_captions_commit_the_translation_of_the_final_transcript() {
    let dir = tempfile::tempdir().unwrap();
    write_hf(dir.path(), 36).unwrap();
    let mut model = tiny_chat_model(10).unwrap();
    let audio = [silence(0.4), voice(1.3), silence(1.0), voice(0.7)].concat();
    let mut whisper = listener(transcriber(&dir));
    let utterances = utterances_of(&mut whisper, &audio, ms(800)).unwrap();
    assert_eq!(utterances.len(), 2);
    for utterance in &utterances {
        assert!(utterance.len() >= 2, "{utterance:?}");
        assert!(utterance.last().unwrap().is_final);
        assert!(utterance.windows(2).all(|w| w[0].at <= w[1].at));
    }
    let config = LiveConfig {
        max_tokens: 16,
        ..LiveConfig::new("German")
    };
    let translator = LiveTranslator::new(&mut model, config.clone()).unwrap();
    let mut captions = LiveCaptions::new(whisper, translator, ClockKind::Simulated);
    let mut events = Vec::new();
    play_recording(&mut captions, &audio, ms(800), &mut |e| events.push(e)).unwrap();
    let finals: Vec<(String, String)> = events
        .iter()
        .filter_map(|e| match &e.kind {
            CaptionEventKind::Caption { source, caption } if caption.is_final => {
                Some((source.clone(), caption.output.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(finals.len(), 2);
    assert_eq!(captions.summary().updates, events.len() - 2);
    drop(captions);
    // The committed caption is autoregressive translation of the final transcript (the
    // library default verifies the final update without bias).
    let ar = LiveConfig {
        max_tokens: config.max_tokens,
        ..LiveConfig::autoregressive("German")
    };
    let mut reference = LiveTranslator::new(&mut model, ar).unwrap();
    for ((source, output), utterance) in finals.iter().zip(&utterances) {
        assert_eq!(source, &utterance.last().unwrap().text);
        let expected = reference
            .update(&spec_voice::Partial::new(Duration::ZERO, source, true))
            .unwrap();
        assert_eq!(output, &expected.output);
    }
}

#[test]
fn the_final_transcript_does_not_depend_on_how_the_audio_arrived() {
    let dir = tempfile::tempdir().unwrap();
    write_hf(dir.path(), 37).unwrap();
    let audio = [
        silence(0.5),
        voice(0.9),
        silence(0.2),
        voice(0.4),
        silence(1.0),
    ]
    .concat();
    let mut whisper = Some(transcriber(&dir));
    let mut finals = Vec::new();
    for piece in [320, 1_000, 4_800, 16_000, audio.len()] {
        let mut listener = listener(whisper.take().unwrap());
        let clock = Clock::simulated();
        let mut heard: Vec<Heard> = Vec::new();
        for chunk in audio.chunks(piece) {
            heard.extend(listener.push(chunk, &clock).unwrap());
        }
        heard.extend(listener.finish(&clock).unwrap());
        let last = heard.last().cloned().unwrap();
        let Heard::Final {
            transcript,
            speech_end,
            ..
        } = last
        else {
            panic!("no final transcript: {heard:?}");
        };
        assert_eq!(speech_end, ms(2000), "piece {piece}");
        finals.push(transcript.text);
        whisper = Some(listener.into_transcriber());
    }
    assert!(!finals[0].is_empty());
    assert!(finals.iter().all(|f| f == &finals[0]), "{finals:?}");
    // It is the transcript of the utterance from the pre-roll to the final margin.
    let config = ListenerConfig::default();
    let from = (ms(500) - config.pre_roll).as_secs_f64() * 16_000.0;
    let to = (ms(2000) + config.final_margin).as_secs_f64() * 16_000.0;
    let mut stream = engine_asr::StreamingTranscriber::new(
        whisper.take().unwrap(),
        listener(transcriber(&dir)).config().transcribe.clone(),
    )
    .unwrap();
    let expected = stream
        .push(&audio[from as usize..to as usize])
        .unwrap()
        .unwrap();
    assert_eq!(finals[0], expected.text);
}

/// A conversation hearing with `config`: the turns, every event, and the conversation's
/// history afterwards.
fn converse_with(
    config: ListenerConfig,
    whisper: Transcriber,
    model: &mut LanguageModel,
    mode: ChatMode,
    audio: &[f32],
) -> (Vec<VoiceTurn>, Vec<ChatEvent>, Vec<Message>, Transcriber) {
    let mut chat = VoiceChat::new(
        Listener::new(whisper, config).unwrap(),
        predgen(model),
        Box::new(FixedLatencySynthesizer::default()),
        mode,
        ClockKind::Simulated,
    );
    let mut events = Vec::new();
    let turns = chat
        .play(audio, Duration::from_millis(1500), &mut |e| {
            events.push(e.clone());
        })
        .unwrap();
    let (listener, session) = chat.into_parts();
    let history = session.history().to_vec();
    (turns, events, history, listener.into_transcriber())
}

fn semantic(policy: SemanticTurnEnd) -> ListenerConfig {
    ListenerConfig {
        turn_end: TurnEnd::Semantic(policy),
        ..random_listener_config()
    }
}

/// The reference of the semantic end of turn: a fixed silence as long as its longest wait.
fn long_silence() -> ListenerConfig {
    let mut config = random_listener_config();
    config.endpoint.silence = SemanticTurnEnd::default().longest;
    config
}

#[test]
fn a_turn_ended_too_early_goes_on_when_speech_resumes_and_is_answered_as_one_question() {
    let dir = tempfile::tempdir().unwrap();
    write_hf(dir.path(), 34).unwrap();
    let mut model = tiny_chat_model(8).unwrap();
    // A question with a 700 ms pause in the middle.
    let audio = [silence(0.5), voice(1.0), silence(0.7), voice(0.9)].concat();
    // Confident of every transcript: the turn ends 150 ms into the pause, too early.
    let hasty = SemanticTurnEnd {
        confident: f32::MIN_POSITIVE,
        ..SemanticTurnEnd::default()
    };
    let mut whisper = transcriber(&dir);
    for mode in [ChatMode::PredGen, ChatMode::Cascade] {
        let (reference, _, reference_history, w) =
            converse_with(long_silence(), whisper, &mut model, mode, &audio);
        let (turns, events, history, w) =
            converse_with(semantic(hasty.clone()), w, &mut model, mode, &audio);
        whisper = w;
        assert_eq!(reference.len(), 1, "{mode:?}");
        let (expected, got) = (&reference[0], turns.last().unwrap());
        assert!(!expected.turn.question.is_empty());
        assert_eq!(got.turn.question, expected.turn.question, "{mode:?}");
        assert_eq!(got.turn.answer, expected.turn.answer, "{mode:?}");
        assert_eq!(got.speech_start, expected.speech_start);
        assert_eq!(got.speech_end, expected.speech_end);
        assert_eq!(
            history, reference_history,
            "{mode:?}: the early turn stays taken back"
        );
        let kinds: Vec<&ChatEventKind> = events.iter().map(|e| &e.kind).collect();
        let resumed = kinds
            .iter()
            .position(|k| matches!(k, ChatEventKind::SpeechResumed { .. }))
            .unwrap_or_else(|| panic!("{mode:?}: no early end: {events:#?}"));
        assert!(matches!(
            kinds[resumed],
            ChatEventKind::SpeechResumed { utterance_start, paused_at }
                if *utterance_start == ms(500) && *paused_at == ms(1500)
        ));
        // Ended 150 ms into the pause, with the model's estimate of the pause's transcript.
        assert!(kinds[..resumed]
            .iter()
            .any(|k| matches!(k, ChatEventKind::EndOfTurn { wait, .. } if *wait == ms(150))));
        assert!(kinds[..resumed].iter().any(
            |k| matches!(k, ChatEventKind::SpeechEnded { speech_end } if *speech_end == ms(1500))
        ));
        // After the user resumed, the only answer spoken is the whole question's.
        let spoken_after: Vec<&str> = kinds[resumed..]
            .iter()
            .filter_map(|k| match k {
                ChatEventKind::Answer(EventKind::FirstSentence { text }) => Some(text.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(spoken_after, vec![expected.turn.first_sentence.as_str()]);
    }
}

#[test]
fn the_semantic_end_of_turn_waits_what_the_models_estimate_calls_for() {
    let dir = tempfile::tempdir().unwrap();
    write_hf(dir.path(), 35).unwrap();
    let mut model = tiny_chat_model(9).unwrap();
    let audio = [silence(0.5), voice(1.2)].concat();
    let (reference, ..) = converse_with(
        long_silence(),
        transcriber(&dir),
        &mut model,
        ChatMode::PredGen,
        &audio,
    );
    let (turns, events, ..) = converse_with(
        semantic(SemanticTurnEnd::default()),
        transcriber(&dir),
        &mut model,
        ChatMode::PredGen,
        &audio,
    );
    assert_eq!(turns.len(), 1);
    let turn = &turns[0];
    assert_eq!(turn.turn.answer, reference[0].turn.answer);
    let (estimated_at, wait) = events
        .iter()
        .find_map(|e| match e.kind {
            ChatEventKind::EndOfTurn { probability, wait } => {
                assert!((0.0..=1.0).contains(&probability));
                assert_eq!(wait, SemanticTurnEnd::default().wait(probability));
                Some((e.at, wait))
            }
            _ => None,
        })
        .expect("an estimate for the pause");
    // The turn ends once the silence has lasted the wait, and not before the estimate.
    let due = (turn.speech_end + wait).max(estimated_at);
    assert!(
        turn.endpoint_at >= due,
        "{:?} before {due:?}",
        turn.endpoint_at
    );
    assert!(
        turn.endpoint_at <= due + ms(40),
        "{:?} long after {due:?}",
        turn.endpoint_at
    );
    assert!(turn.endpoint_at - turn.speech_end <= SemanticTurnEnd::default().longest);
}

#[test]
fn the_semantic_end_of_turn_survives_noise_a_monologue_and_a_stream_cut_mid_word() {
    let dir = tempfile::tempdir().unwrap();
    write_hf(dir.path(), 36).unwrap();
    let mut model = tiny_chat_model(10).unwrap();
    let config = semantic(SemanticTurnEnd::default());
    // Silence alone, and steady noise alone: nothing to answer.
    let hum: Vec<f32> = (0..64_000)
        .map(|i| 0.02 * (i as f32 * 0.07).sin())
        .collect();
    let mut whisper = transcriber(&dir);
    for audio in [silence(3.0), hum] {
        let (turns, events, history, w) = converse_with(
            config.clone(),
            whisper,
            &mut model,
            ChatMode::PredGen,
            &audio,
        );
        whisper = w;
        assert!(turns.is_empty() && history.is_empty(), "{events:?}");
    }
    // Speech without a long pause: cut at the longest utterance (4 s here, to fit the tiny
    // model's context), each part a turn of its own that no resumed speech merges.
    let mut long = config.clone();
    long.endpoint.max_utterance = Duration::from_secs(4);
    let burst = [voice(0.8), silence(0.1)].concat();
    let monologue: Vec<f32> = std::iter::once(silence(0.3))
        .chain(std::iter::repeat_n(burst, 10))
        .flatten()
        .collect();
    let (turns, events, ..) =
        converse_with(long, whisper, &mut model, ChatMode::Cascade, &monologue);
    // (Each part's speech interrupts the answer to the one before: the last is answered.)
    let ends = events
        .iter()
        .filter(|e| matches!(e.kind, ChatEventKind::SpeechEnded { .. }))
        .count();
    assert!(ends >= 2, "{ends} ends");
    assert_eq!(turns.len(), 1);
    assert!(turns[0].speech_end - turns[0].speech_start <= Duration::from_secs(4));
    assert!(events
        .iter()
        .all(|e| !matches!(e.kind, ChatEventKind::SpeechResumed { .. })));
    // Clipped audio cut off mid-word: the stream's end ends the turn.
    let clipped: Vec<f32> = voice(1.0)
        .iter()
        .map(|s| (s * 4.0).clamp(-1.0, 1.0))
        .collect();
    let mut chat = VoiceChat::new(
        Listener::new(transcriber(&dir), config).unwrap(),
        predgen(&mut model),
        Box::new(FixedLatencySynthesizer::default()),
        ChatMode::PredGen,
        ClockKind::Simulated,
    );
    let audio = [silence(0.3), clipped].concat();
    for packet in audio.chunks(320) {
        chat.hear_audio(packet).unwrap();
        while chat.step().unwrap() {}
    }
    chat.end_of_audio().unwrap();
    while chat.step().unwrap() {}
    let events = chat.take_events();
    assert!(events.iter().any(
        |e| matches!(e.kind, ChatEventKind::SpeechEnded { speech_end } if speech_end == ms(1300))
    ));
    assert!(events
        .iter()
        .any(|e| matches!(e.kind, ChatEventKind::TurnDone(_))));
}

#[test]
fn a_cancelled_answer_stops_at_once_and_an_utterance_in_progress_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    write_hf(dir.path(), 32).unwrap();
    let mut model = tiny_chat_model(6).unwrap();
    let mut chat = VoiceChat::new(
        listener(transcriber(&dir)),
        predgen(&mut model),
        Box::new(FixedLatencySynthesizer::default()),
        ChatMode::Cascade,
        ClockKind::Simulated,
    );
    // Mid-utterance a cancel drops nothing: there is no answer yet.
    chat.hear_audio(&[silence(0.3), voice(0.8)].concat())
        .unwrap();
    chat.cancel_answer().unwrap();
    assert!(chat.in_turn());
    chat.hear_audio(&silence(1.5)).unwrap();
    let heard = chat.take_events();
    assert!(heard
        .iter()
        .any(|e| matches!(e.kind, ChatEventKind::Transcript { .. })));
    assert!(!heard
        .iter()
        .any(|e| matches!(e.kind, ChatEventKind::AnswerCancelled)));
    // The answer has begun: a cancel ends the turn, and no more of it comes.
    assert!(chat.step().unwrap());
    chat.cancel_answer().unwrap();
    assert!(!chat.in_turn());
    let events = chat.take_events();
    let cancelled = events
        .iter()
        .position(|e| matches!(e.kind, ChatEventKind::AnswerCancelled))
        .expect("the answer is cancelled");
    assert_eq!(cancelled, events.len() - 1);
    assert!(!chat.step().unwrap());
    assert!(chat.take_events().is_empty());
    // The next question is answered as usual.
    let turns = chat
        .play(&[voice(0.6), silence(0.2)].concat(), ms(1500), &mut |_| {})
        .unwrap();
    assert_eq!(turns.len(), 1);
}
