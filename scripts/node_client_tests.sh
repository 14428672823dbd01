#!/usr/bin/env bash
# Google's Node.js Pub/Sub client's own system tests and samples tests against a Pigeon server on loopback.
# A long run (npm installs, ~10 minutes), not part of `make test`.
#
#   scripts/node_client_tests.sh [DIR]      # DIR: a checkout of googleapis/nodejs-pubsub (cloned when absent;
#                                           # default /tmp/nodejs-pubsub)
# Environment: PORT (18085), PYTHON (.venv/bin/python), NODE_TESTS=system,samples (which suites).
# Needs node >= 18 and npm with the npm registry reachable; prints each suite's passing/failing/pending counts.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
DIR=${1:-/tmp/nodejs-pubsub}
PORT=${PORT:-18085}
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
SUITES=${NODE_TESTS:-system,samples}
export PUBSUB_EMULATOR_HOST=127.0.0.1:$PORT GCLOUD_PROJECT=pigeon-node GOOGLE_CLOUD_PROJECT=pigeon-node

if [ ! -f "$DIR/system-test/pubsub.ts" ]; then
    git clone --depth 1 https://github.com/googleapis/nodejs-pubsub.git "$DIR"
fi

cd "$DIR"
if [ ! -f build/src/index.js ]; then
    npm install --no-audit --no-fund --ignore-scripts
    # google-gax pins its own google-auth-library; two copies of it fail the library's compile (TS2345)
    gal=$(node -p "require('./node_modules/google-gax/package.json').dependencies['google-auth-library']")
    npm install --no-audit --no-fund --no-save --ignore-scripts "google-auth-library@$gal"
    npm run compile-protos && npm run compile
fi
if [[ $SUITES == *samples* && ! -f samples/build/system-test/common.js ]]; then
    (cd samples
     npm pkg delete "devDependencies.@google-cloud/typeless-sample-bot"  # for regenerating samples only; gone from npm
     npm install --no-audit --no-fund
     npm install --no-audit --no-fund --no-save ..  # the samples against this checkout's library, as CI links it
     npm run compile && cp -f ./*.js build/)
fi

data=$(mktemp -d)
(cd "$REPO" && exec "$PYTHON" -m pigeon serve --host 127.0.0.1 --port "$PORT" --data-dir "$data") \
    > "$data.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -rf "$data"' EXIT
for _ in $(seq 100); do
    grep -q "listening on" "$data.log" && break
    sleep 0.2
done

summary=()
run() {  # run NAME DIR: mocha over DIR/build/system-test, its counts kept for the summary
    local log=$DIR/$1.log
    (cd "$2" && npx mocha build/system-test --timeout 120000) 2>&1 | tee "$log" || true
    summary+=("$1: $(grep -Eo '[0-9]+ (passing|failing|pending)' "$log" | paste -sd, -)")
}
[[ $SUITES == *system* ]] && run system "$DIR"
[[ $SUITES == *samples* ]] && run samples "$DIR/samples"
printf '%s\n' "${summary[@]}"
echo "server log: $data.log"
