#!/usr/bin/env bash
# Runs deploy/nginx.conf for real on this machine: a self-signed certificate, nginx on :18443
# in front of `specvoice serve` on :18080 (real models from the models folder, a key), and the
# official `openai` client through it over HTTPS and WSS (deploy/through_proxy.py: models,
# streamed chat, speech, a transcription, a wrong key, a Realtime session), then an origin check
# with curl. Needs nginx and espeak-ng (apt-get install nginx espeak-ng), a release build of
# specvoice, and the openai package (the venv `cargo test -p specvoice --test openai_api --
# --ignored` makes, or PYTHON=...).
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
# nginx's workers (www-data) write request bodies below it.
chmod 755 "$work"
python=${PYTHON:-target/tmp/openai-venv/bin/python}
trap 'nginx -s quit -c "$work/nginx.conf" -p "$work" 2>/dev/null || true; kill "$server" 2>/dev/null || true; sleep 1; rm -rf "$work"' EXIT

openssl req -x509 -newkey rsa:2048 -nodes -keyout "$work/key.pem" -out "$work/cert.pem" \
    -days 1 -subj "/CN=localhost" 2>/dev/null
{
    echo "pid $work/nginx.pid;"
    echo "error_log $work/error.log;"
    sed -e "s#server 10.0.0.11:8080 max_fails=3 fail_timeout=10s;#server 127.0.0.1:18080;#" \
        -e "/server 10.0.0.12:8080/d" \
        -e "s#listen 443 ssl;#listen 18443 ssl;#" \
        -e "s#server_name voice.example.com;#server_name localhost;#" \
        -e "s#/etc/ssl/voice.example.com.crt#$work/cert.pem#" \
        -e "s#/etc/ssl/voice.example.com.key#$work/key.pem#" \
        -e "s#^http {#http {\n    access_log $work/access.log;\n    client_body_temp_path $work/body;\n    proxy_temp_path $work/proxy;#" \
        deploy/nginx.conf
} > "$work/nginx.conf"
nginx -t -c "$work/nginx.conf" -p "$work"

SPECVOICE_API_KEYS=sk-proxy target/release/specvoice serve --addr 127.0.0.1:18080 \
    --model qwen2.5-coder-0.5b-instruct --asr whisper-tiny.en-ct2 --voice espeak --max-tokens 24 \
    > "$work/serve.log" 2>&1 &
server=$!
until curl -sf http://127.0.0.1:18080/health > /dev/null; do sleep 1; done
nginx -c "$work/nginx.conf" -p "$work"

(cd "$work" && "$OLDPWD/$python" "$OLDPWD/deploy/through_proxy.py")
for origin in https://localhost:18443 https://evil.example; do
    curl -sk -o /dev/null -w "origin $origin: %{http_code}\n" -H "Authorization: Bearer sk-proxy" \
        -H "Origin: $origin" https://localhost:18443/voices
done
