"""faster-whisper on one long recording, for `bench_asr`'s long-form comparison.

Reads raw little-endian float32 16 kHz samples (the very samples SpecVoice transcribes) and
runs `WhisperModel.transcribe` with its defaults for long audio (timestamps, previous-text
conditioning, temperature fallback) except greedy decoding and language en, with or without
its VAD filter. Prints one JSON object: text, segments, seconds, peak RSS. Tooling outside the
product: never imported by the library.
"""

import argparse
import json
import resource
import time

import numpy as np
from faster_whisper import WhisperModel


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True, help="CTranslate2 model folder")
    parser.add_argument("--compute-type", default="int8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--vad", action="store_true")
    parser.add_argument("samples", help="raw float32 samples at 16 kHz")
    args = parser.parse_args()
    model = WhisperModel(
        args.model, device="cpu", compute_type=args.compute_type, cpu_threads=args.threads
    )
    audio = np.fromfile(args.samples, dtype="<f4")
    options = dict(beam_size=1, best_of=1, language="en", vad_filter=args.vad)
    # Warm-up on the first 5 s (first-call allocations), not timed.
    list(model.transcribe(audio[: 16000 * 5], **options)[0])
    start = time.perf_counter()
    segments, _ = model.transcribe(audio, **options)
    segments = [(s.start, s.end, s.text) for s in segments]
    seconds = time.perf_counter() - start
    print(
        json.dumps(
            {
                "text": "".join(text for _, _, text in segments).strip(),
                "segments": len(segments),
                "seconds": seconds,
                "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
    )


if __name__ == "__main__":
    main()
