"""faster-whisper's word timestamps on clips, for `parity_words` and the word-timing fixture.

Run with the Python named by SPECVOICE_FASTER_WHISPER (a venv with faster-whisper 1.2.1). Each
clip is raw 16 kHz little-endian f32 samples (the very samples the Rust side decodes), or a WAV
file. Settings as the parity harness's, with `word_timestamps=True`: f32, greedy (temperature 0
only), language en, no VAD, no previous-text conditioning; timestamps decoded unless
`--without-timestamps`. Prints one JSON object: per model (its folder's name) and clip, the
segments with their times, text and words (`[word, start, end, probability]`).
Tooling outside the product: never imported by the library.
"""

import argparse
import json
import os

import numpy as np
from faster_whisper import WhisperModel
from faster_whisper.audio import decode_audio


def read(clip):
    if clip.endswith(".wav"):
        return decode_audio(clip, sampling_rate=16000)
    return np.fromfile(clip, dtype="<f4")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--model", required=True, action="append", help="CTranslate2 model folder (repeatable)"
    )
    parser.add_argument("--compute-type", default="float32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--without-timestamps", action="store_true")
    parser.add_argument(
        "--names",
        action="store_true",
        help="name clips by their folder and file name instead of their path",
    )
    parser.add_argument("clips", nargs="+", help="raw f32 or WAV files")
    args = parser.parse_args()
    models = {}
    for folder in args.model:
        models[os.path.basename(os.path.normpath(folder))] = transcribe(folder, args)
    print(
        json.dumps(
            {
                "faster_whisper": __import__("faster_whisper").__version__,
                "compute_type": args.compute_type,
                "without_timestamps": args.without_timestamps,
                "models": models,
            }
        )
    )


def transcribe(folder, args):
    model = WhisperModel(
        folder, device="cpu", compute_type=args.compute_type, cpu_threads=args.threads
    )
    results = []
    for clip in args.clips:
        segments, _ = model.transcribe(
            read(clip),
            beam_size=1,
            best_of=1,
            temperature=0.0,
            language="en",
            without_timestamps=args.without_timestamps,
            condition_on_previous_text=False,
            vad_filter=False,
            word_timestamps=True,
        )
        name = clip
        if args.names:
            name = os.path.join(os.path.basename(os.path.dirname(clip)), os.path.basename(clip))
        results.append(
            {
                "clip": name,
                "segments": [
                    {
                        "start": round(s.start, 3),
                        "end": round(s.end, 3),
                        "text": s.text,
                        "words": [
                            [w.word, round(w.start, 3), round(w.end, 3), round(w.probability, 4)]
                            for w in s.words
                        ],
                    }
                    for s in segments
                ],
            }
        )
    return results


if __name__ == "__main__":
    main()
