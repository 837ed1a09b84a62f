#!/bin/sh
# Image entrypoint: `sidecar-ops ARGS` and other commands (prefect, python, ray, sh ...) run as given;
# arguments that do not start with a command are sidecar-ops arguments (`IMAGE run PIPELINE.yaml ...`).
set -e
if [ "$#" -eq 0 ]; then
    exec sidecar-ops --help
fi
case "$1" in
    -*) exec sidecar-ops "$@" ;;
esac
if command -v "$1" >/dev/null 2>&1; then
    exec "$@"
fi
exec sidecar-ops "$@"
