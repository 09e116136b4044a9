"""Drives SpecVoice's OpenAI-compatible endpoints with the official `openai` package.

Run by `tests/openai_api.rs` (which starts a server on tiny random-weight models and installs the
pinned package into a virtual environment): `python openai_client.py SETUP_JSON`. SETUP_JSON names
the server's address, key and models, a WAV file to transcribe, and the answer plain greedy
decoding gives. Every check is an assertion; the last line printed is `ok` and a JSON summary.
"""

import base64
import json
import sys
import wave

import httpx2 as httpx
import openai

setup = json.loads(sys.argv[1])
base = setup["base_url"]
client = openai.OpenAI(base_url=base + "/v1", api_key=setup["key"], max_retries=0)
chat_model = setup["chat_model"]
question = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": setup["question"]},
]
summary = {}

# Models.
ids = [m.id for m in client.models.list()]
assert chat_model in ids, ids

# Chat, whole: greedy with speculation gives plain greedy decoding's answer.
completion = client.chat.completions.create(
    model=chat_model, messages=question, temperature=0, max_tokens=setup["max_tokens"]
)
choice = completion.choices[0]
assert choice.message.role == "assistant"
assert choice.message.content == setup["expected"], (choice.message.content, setup["expected"])
assert choice.finish_reason in ("stop", "length"), choice.finish_reason
assert completion.usage.completion_tokens > 0
assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens
summary["usage"] = completion.usage.model_dump()

# Chat, streamed, with usage at the end.
deltas, finish, usage = [], None, None
stream = client.chat.completions.create(
    model=chat_model,
    messages=question,
    temperature=0,
    max_completion_tokens=setup["max_tokens"],
    stream=True,
    stream_options={"include_usage": True},
)
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        if c.delta.content:
            deltas.append(c.delta.content)
        if c.finish_reason:
            finish = c.finish_reason
assert "".join(deltas) == setup["expected"], deltas
assert finish == choice.finish_reason
assert usage is not None and usage.completion_tokens == completion.usage.completion_tokens
summary["streamed_deltas"] = len(deltas)

# Sampled answers repeat with their seed; stop strings cut.
sampled = [
    client.chat.completions.create(
        model=chat_model, messages=question, temperature=0.9, top_p=0.95, seed=7, max_tokens=16
    ).choices[0].message.content
    for _ in range(2)
]
assert sampled[0] == sampled[1], sampled

# Transcriptions in every format.
with open(setup["wav"], "rb") as f:
    wav = f.read()
text = client.audio.transcriptions.create(model="whisper-1", file=("q.wav", wav)).text
assert isinstance(text, str)
plain = client.audio.transcriptions.create(model="whisper-1", file=("q.wav", wav), response_format="text")
assert isinstance(plain, str) and plain.strip() == text.strip(), (plain, text)
verbose = client.audio.transcriptions.create(
    model="whisper-1", file=("q.wav", wav), response_format="verbose_json", language="en", prompt="Tones."
)
assert verbose.duration > 0 and isinstance(verbose.segments, list)
for fmt, head in (("srt", "1\n"), ("vtt", "WEBVTT")):
    subtitles = client.audio.transcriptions.create(model="whisper-1", file=("q.wav", wav), response_format=fmt)
    assert not verbose.segments or subtitles.startswith(head), (fmt, subtitles)
summary["transcript"] = text

# Speech, streamed.
with client.audio.speech.with_streaming_response.create(
    model="tts-1", voice="alloy", input="Hello there. How are you today?", response_format="wav"
) as response:
    audio = b"".join(response.iter_bytes())
assert audio[:4] == b"RIFF" and audio[8:16] == b"WAVEfmt " and len(audio) > 44 + 2000, len(audio)
pcm = client.audio.speech.create(model="tts-1", voice=setup["voice"], input="One sentence.", response_format="pcm")
assert len(pcm.content) % 2 == 0 and len(pcm.content) > 0
summary["speech_bytes"] = len(audio)

# Errors: OpenAI-shaped, with the status the client maps to its exceptions.
def fails(exception, call):
    try:
        call()
    except exception as e:
        body = e.body if isinstance(e.body, dict) else {}
        assert "message" in body, e.body
        return e
    raise AssertionError(f"no {exception.__name__}")

bad_key = openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0)
fails(openai.AuthenticationError, lambda: bad_key.models.list())
fails(openai.NotFoundError, lambda: client.chat.completions.create(model="gpt-9", messages=question))
fails(openai.BadRequestError, lambda: client.chat.completions.create(model=chat_model, messages=question, temperature=5))
fails(openai.BadRequestError, lambda: client.chat.completions.create(model=chat_model, messages=[]))
fails(openai.BadRequestError, lambda: client.chat.completions.create(
    model=chat_model, messages=question, extra_body={"surprise": 1}))
fails(openai.BadRequestError, lambda: client.audio.speech.create(model="tts-1", voice="nobody", input="Hi."))
# The test's voice has no pace of its own to change (Kokoro and Piper do).
fails(openai.BadRequestError, lambda: client.audio.speech.create(model="tts-1", voice="alloy", input="Hi.", speed=2.0))
fails(openai.BadRequestError, lambda: client.audio.speech.create(model="tts-1", voice="alloy", input="Hi.", speed=9.0))
fails(openai.BadRequestError, lambda: client.audio.transcriptions.create(model="whisper-1", file=("x.mp3", b"ID3 no wav")))
fails(openai.BadRequestError, lambda: client.chat.completions.create(
    model=chat_model, messages=[{"role": "user", "content": "word " * 5000}]))

# Raw HTTP: a wrong content type, a body over the limit, a client gone mid-stream.
headers = {"Authorization": "Bearer " + setup["key"]}
r = httpx.post(base + "/v1/chat/completions", headers=headers, content=b"model=x")
assert r.status_code == 400 and "error" in r.json(), r.text
# A 100 MB body: refused with 413 once the server has read past its limit.
big = b"{" + b" " * (100 << 20) + b"}"
r = httpx.post(base + "/v1/chat/completions", headers={**headers, "Content-Type": "application/json"},
               content=big, timeout=60)
assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large", r.text
with httpx.stream("POST", base + "/v1/chat/completions", headers=headers, timeout=60, json={
        "model": chat_model, "messages": question, "stream": True, "max_tokens": 64}) as r:
    for line in r.iter_lines():
        break
r = httpx.get(base + "/health")
assert r.status_code == 200, r.text
r = httpx.get(base + "/metrics", headers=headers)
assert r.status_code == 200 and "specvoice_requests_total" in r.text
assert httpx.get(base + "/metrics").status_code == 401
# The server still answers, the same answer as before.
again = client.chat.completions.create(
    model=chat_model, messages=question, temperature=0, max_tokens=setup["max_tokens"]
)
assert again.choices[0].message.content == setup["expected"]

# Realtime: a spoken question (16 kHz PCM, a rate the session sets) in, the spoken answer out.
with wave.open(setup["wav"], "rb") as w:
    question_pcm = w.readframes(w.getnframes())
silence = b"\x00\x00" * 16000 * 2
events = []
with client.realtime.connect(model="gpt-realtime") as conn:
    conn.session.update(session={
        "type": "realtime",
        "instructions": "Answer briefly.",
        "audio": {
            "input": {"format": {"type": "audio/pcm", "rate": 16000},
                      "turn_detection": {"type": "server_vad", "silence_duration_ms": 500}},
            "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "alloy"},
        },
    })
    conn.send({"type": "input_audio_buffer.append", "audio": "not base64!"})
    audio = question_pcm + silence
    for at in range(0, len(audio), 640):
        conn.input_audio_buffer.append(audio=base64.b64encode(audio[at:at + 640]).decode())
        if at == 640 * 4:
            # The session hears already: how it hears and answers stays as it started.
            conn.session.update(session={"type": "realtime", "instructions": "Answer at length."})
    answer_audio = b""
    for event in conn:
        events.append(event.type)
        if event.type == "error":
            summary.setdefault("realtime_errors", []).append(event.error.code)
        elif event.type == "conversation.item.input_audio_transcription.completed":
            heard = event.transcript
        elif event.type == "response.output_audio.delta":
            answer_audio += base64.b64decode(event.delta)
        elif event.type == "response.output_audio_transcript.done":
            spoken = event.transcript
        elif event.type == "response.done":
            assert event.response.status == "completed", event.response
            break
order = ["session.created", "session.updated", "input_audio_buffer.speech_started",
         "input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
         "conversation.item.input_audio_transcription.completed", "response.created",
         "response.output_audio.delta", "response.output_audio_transcript.done", "response.done"]
positions = [events.index(kind) for kind in order]
assert positions == sorted(positions), events
assert summary["realtime_errors"] == ["invalid_base64", "session_active"], (summary, events)
assert len(answer_audio) > 0 and len(answer_audio) % 2 == 0
# The spoken answer is the cascade's: the chat model's greedy answer to what was heard.
cascade = client.chat.completions.create(
    model=chat_model, temperature=0, max_tokens=setup["answer_tokens"],
    messages=[{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": heard}],
).choices[0].message.content
assert " ".join(spoken.split()) == " ".join(cascade.split()), (spoken, cascade)
summary["realtime_events"] = len(events)

print("ok " + json.dumps(summary))
