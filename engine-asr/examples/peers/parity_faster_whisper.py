"""faster-whisper's token ids on the parity clips, for `parity_faster_whisper`'s comparison.

Run by the example with the Python named by SPECVOICE_FASTER_WHISPER (a venv with
faster-whisper 1.2.1). Each clip is raw 16 kHz little-endian f32 samples (the very samples the
Rust side decodes). Prints one JSON object: per clip, the tokens of every segment (text tokens,
no prompt, no end token), the text and the temperature of the accepted decoding.
Tooling outside the product: never imported by the library.
"""

import argparse
import json

import numpy as np
from faster_whisper import WhisperModel


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True, help="CTranslate2 model folder")
    parser.add_argument("--compute-type", default="float32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--fallback",
        action="store_true",
        help="faster-whisper's default temperatures (0, 0.2, ..., 1) instead of 0 only",
    )
    parser.add_argument("clips", nargs="+", help="raw f32 files")
    args = parser.parse_args()
    model = WhisperModel(
        args.model, device="cpu", compute_type=args.compute_type, cpu_threads=args.threads
    )
    options = dict(
        beam_size=1,
        best_of=1,
        language="en",
        without_timestamps=True,
        condition_on_previous_text=False,
        vad_filter=False,
        suppress_blank=True,
        suppress_tokens=[-1],
    )
    if not args.fallback:
        options["temperature"] = 0.0
    results = []
    for clip in args.clips:
        audio = np.fromfile(clip, dtype="<f4")
        segments, _ = model.transcribe(audio, **options)
        segments = list(segments)
        results.append(
            {
                "clip": clip,
                "tokens": [t for s in segments for t in s.tokens],
                "text": "".join(s.text for s in segments).strip(),
                "temperatures": [s.temperature for s in segments],
            }
        )
    print(json.dumps({"compute_type": args.compute_type, "results": results}))


if __name__ == "__main__":
    main()
