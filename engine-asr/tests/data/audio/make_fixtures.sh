#!/bin/sh
# Makes the audio fixtures of engine-asr/tests/formats.rs from one real clip: `cards/003.wav` of
# the models folder's speech data (CMU Sphinx's test clips, BSD-2: see COPYRIGHT here), "four
# queen of clubs", 1.96 s, 16 kHz mono 16-bit. Needs ffmpeg (Debian's, with libmp3lame,
# libvorbis and libopus); the tests do not.
#
#   sh engine-asr/tests/data/audio/make_fixtures.sh [SOURCE.wav]
set -eu
cd "$(dirname "$0")"
source="${1:-${SPECVOICE_MODELS:-$HOME/.cache/specvoice/models}/data/speech/cards/003.wav}"
ff() { ffmpeg -hide_banner -loglevel error -y -bitexact "$@"; }

cp "$source" cards-003.wav
# Lossless, as recorded (16 kHz mono).
ff -i cards-003.wav -c:a flac cards-003.flac
# Stereo: the clip on the left, at half its amplitude on the right.
ff -i cards-003.wav -af "pan=stereo|c0=c0|c1=0.5*c0" -c:a flac cards-003-stereo.flac
# Lossy, as recorded.
ff -i cards-003.wav -c:a libmp3lame -b:a 48k cards-003.mp3
ff -i cards-003.wav -c:a libvorbis -q:a 4 cards-003.ogg
ff -i cards-003.wav -c:a aac -b:a 48k cards-003.m4a
# 44.1 kHz stereo (resampled by ffmpeg's soxr-free default resampler), lossless and lossy.
ff -i cards-003.wav -af "aresample=44100,pan=stereo|c0=c0|c1=c0" -c:a flac cards-003-44k-stereo.flac
ff -i cards-003.wav -af "aresample=44100,pan=stereo|c0=c0|c1=c0" -c:a libmp3lame -b:a 96k cards-003-44k-stereo.mp3
ff -i cards-003.wav -af "aresample=44100,pan=stereo|c0=c0|c1=c0" -c:a libvorbis -q:a 2 cards-003-44k-stereo.ogg
ff -i cards-003.wav -af "aresample=44100,pan=stereo|c0=c0|c1=c0" -c:a aac -b:a 96k cards-003-44k-stereo.m4a
# A codec no decoder here reads: Opus in OGG.
ff -i cards-003.wav -t 0.5 -c:a libopus -b:a 16k unsupported-opus.ogg
ls -l
# Seeds of the `audio` fuzz target (spec-fuzz): a tenth of a second in each format.
seeds=../../../../spec-fuzz/seeds/audio
mkdir -p "$seeds"
ff -i cards-003.wav -ss 0.5 -t 0.1 -c:a flac "$seeds/short.flac"
ff -i cards-003.wav -ss 0.5 -t 0.1 -c:a libmp3lame -b:a 32k "$seeds/short.mp3"
ff -i cards-003.wav -ss 0.5 -t 0.1 -c:a libvorbis -q:a 0 "$seeds/short.ogg"
ff -i cards-003.wav -ss 0.5 -t 0.1 -ac 2 -c:a aac -b:a 32k "$seeds/short.m4a"
ff -i cards-003.wav -ss 0.5 -t 0.05 -ac 2 -ar 22050 -c:a pcm_s24le "$seeds/short.wav"
ls -l "$seeds"
