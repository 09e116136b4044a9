"""faster-whisper on the benchmark clips, for `bench_asr`'s same-run comparison.

Run by the benchmark with the Python named by SPECVOICE_FASTER_WHISPER (a venv with
faster-whisper 1.2.1): prints one JSON object with each clip's text and seconds, per compute
type. Tooling outside the product: never imported by the library.
"""

import argparse
import json
import time

from faster_whisper import WhisperModel
from faster_whisper.audio import decode_audio


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True, help="CTranslate2 model folder")
    parser.add_argument("--compute-type", default="int8")
    parser.add_argument("--beam", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("clips", nargs="+")
    args = parser.parse_args()
    model = WhisperModel(
        args.model, device="cpu", compute_type=args.compute_type, cpu_threads=args.threads
    )
    options = dict(
        beam_size=args.beam,
        best_of=1,
        language="en",
        without_timestamps=True,
        condition_on_previous_text=False,
        vad_filter=False,
    )
    # Warm-up (first-call allocations), not timed.
    list(model.transcribe(decode_audio(args.clips[0]), **options)[0])
    results = []
    for clip in args.clips:
        best = None
        text = ""
        for _ in range(args.repeats):
            start = time.perf_counter()
            audio = decode_audio(clip)
            segments, _ = model.transcribe(audio, **options)
            text = "".join(s.text for s in segments).strip()
            elapsed = time.perf_counter() - start
            best = elapsed if best is None else min(best, elapsed)
        results.append({"clip": clip, "text": text, "seconds": best})
    print(json.dumps({"compute_type": args.compute_type, "results": results}))


if __name__ == "__main__":
    main()
