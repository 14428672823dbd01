#!/usr/bin/env bash
# Install the servers `make bench` compares Pigeon with, from Debian packages, when they are missing:
# RabbitMQ, NATS, Redis, and Google's Pub/Sub emulator (with a Java runtime). Services are not started:
# `pigeon bench` starts each on loopback with its own data directory and stops it afterwards.
# A package that cannot be installed is reported; the benchmark then lists that peer as "not run".
set -u

need=()
[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || need+=(rabbitmq-server)
command -v nats-server >/dev/null || need+=(nats-server)
command -v redis-server >/dev/null || need+=(redis-server)
command -v gcloud >/dev/null || need+=(google-cloud-cli)
[ -d /usr/lib/google-cloud-sdk/platform/pubsub-emulator ] || need+=(google-cloud-cli-pubsub-emulator)
command -v java >/dev/null || need+=(default-jre-headless)

if [ ${#need[@]} -eq 0 ]; then
    echo "bench peers: all installed"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "bench peers: missing ${need[*]} (run as root to install them); the benchmark will skip them"
    exit 0
fi

# keep package scripts from starting the services we install
guard=""
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    guard=1
fi
trap '[ -n "$guard" ] && rm -f /usr/sbin/policy-rc.d' EXIT

echo "bench peers: installing ${need[*]}"
timeout 600 apt-get update -qq || true
for p in "${need[@]}"; do
    if apt-cache show "$p" >/dev/null 2>&1; then
        DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq --no-install-recommends "$p" \
            >/dev/null || echo "bench peers: could not install $p"
    else
        echo "bench peers: no Debian package $p here"
    fi
done
exit 0
