"""Reference log-mel spectrograms for engine-asr's front-end test.

Computes Whisper's log-mel spectrogram (n_fft 400, hop 160, periodic Hann window, reflect
padding, power spectrum without the last frame, Slaney mel filters, log10 clamped at 1e-10 and
at max - 8, then (x + 4) / 4) with faster-whisper 1.2.1's numpy implementation of it
(`faster_whisper/feature_extractor.py`, no padding) on a fixed 0.25 s signal, for 80 and 128
mel bins, and writes mel_reference.json. Run outside the product, e.g.:

    pip download --no-deps faster-whisper==1.2.1 && unzip faster_whisper-1.2.1-py3-none-any.whl \
        faster_whisper/feature_extractor.py && pip install numpy
    PYTHONPATH=. python3 make_mel_reference.py
"""

import json
import math

import numpy as np
from faster_whisper.feature_extractor import FeatureExtractor

RATE = 16000
SAMPLES = 4000

# A tone, a chirp and a little deterministic noise (a linear congruential generator).
signal = []
state = 12345
for n in range(SAMPLES):
    t = n / RATE
    state = (1103515245 * state + 12345) % 2**31
    noise = (state / 2**31 - 0.5) * 0.02
    value = 0.4 * math.sin(2 * math.pi * 440 * t) + 0.3 * math.sin(2 * math.pi * (200 + 6000 * t) * t) + noise
    signal.append(float(np.float32(value)))
waveform = np.array(signal, dtype=np.float32)

reference = {"sample_rate": RATE, "signal": signal}
for n_mels in (80, 128):
    features = FeatureExtractor(feature_size=n_mels)(waveform, padding=0)
    reference[f"mel{n_mels}"] = [[round(float(v), 6) for v in row] for row in features]

with open("mel_reference.json", "w") as f:
    json.dump(reference, f)
print({k: np.array(v).shape for k, v in reference.items() if k.startswith("mel")})

# The encoder's 30-second window for this signal as faster-whisper's transcribe builds it:
# the spectrogram with its default 160 samples of padding, cut at the audio's last frame and
# padded to 3000 frames by pad_or_trim. Written as its audio frames and the padding's values.
from faster_whisper.audio import pad_or_trim

features = FeatureExtractor(feature_size=80)(waveform)
content_frames = features.shape[-1] - 1
window = pad_or_trim(features[:, :content_frames])
window_reference = {
    "frames": int(window.shape[-1]),
    "audio_frames": content_frames,
    "audio": [[round(float(v), 6) for v in row[:content_frames]] for row in window],
    "padding_values": sorted(set(float(v) for v in window[:, content_frames:].ravel())),
}
with open("window_reference.json", "w") as f:
    json.dump(window_reference, f)
print({"window": window.shape, "padding": window_reference["padding_values"]})
