"""The official openai client through deploy/nginx.conf (run by deploy/try-nginx.sh): HTTPS and WSS."""
import base64, ssl, subprocess, sys, wave
import httpx2 as httpx
import openai

base = "https://localhost:18443"
client = openai.OpenAI(base_url=base + "/v1", api_key="sk-proxy", http_client=httpx.Client(verify=False), max_retries=0)
print("models:", [m.id for m in client.models.list()])
deltas = []
for chunk in client.chat.completions.create(model="qwen2.5-coder-0.5b-instruct", temperature=0, max_tokens=24, stream=True,
        messages=[{"role": "user", "content": "How do I reverse a list in Python?"}]):
    for c in chunk.choices:
        if c.delta.content:
            deltas.append(c.delta.content)
print("streamed deltas:", len(deltas), repr("".join(deltas))[:80])
with client.audio.speech.with_streaming_response.create(model="tts-1", voice="alloy", input="Hello there. How are you?") as r:
    audio = b"".join(r.iter_bytes())
print("speech bytes:", len(audio), audio[:4])
subprocess.run(["espeak-ng", "-w", "q.wav", "What is the capital of France?"], check=True)
print("transcript:", client.audio.transcriptions.create(model="whisper-1", file=open("q.wav", "rb")).text)
try:
    openai.OpenAI(base_url=base + "/v1", api_key="wrong", http_client=httpx.Client(verify=False), max_retries=0).models.list()
except openai.AuthenticationError as e:
    print("wrong key:", e.status_code)
ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
with wave.open("q.wav") as w:
    rate, pcm = w.getframerate(), w.readframes(w.getnframes())
pcm += b"\x00\x00" * rate * 2
with client.realtime.connect(model="gpt-realtime", websocket_connection_options={"ssl": ctx}) as conn:
    conn.session.update(session={"type": "realtime", "audio": {"input": {"format": {"type": "audio/pcm", "rate": rate}}}})
    step = rate // 50 * 2
    for at in range(0, len(pcm), step):
        conn.input_audio_buffer.append(audio=base64.b64encode(pcm[at:at + step]).decode())
    kinds, got = [], 0
    for event in conn:
        kinds.append(event.type)
        if event.type == "response.output_audio.delta":
            got += len(base64.b64decode(event.delta))
        if event.type == "conversation.item.input_audio_transcription.completed":
            print("realtime heard:", event.transcript)
        if event.type == "response.output_audio_transcript.done":
            print("realtime answer:", event.transcript)
        if event.type in ("response.done", "error"):
            print("realtime:", event.type, getattr(getattr(event, "response", None), "status", None), "audio bytes", got)
            break
print("ok through nginx")
