#!/usr/bin/env bash
# test-against-vq.sh VQ_BIN [SERVLET_JAR]: every verifier (Node, Python, Java) accepts a token
# that the built `vq mint` signs and refuses it for another user, target and type; a token that
# `vq mint --ttl 0` signs is expired; during a rotation a token signed with the previous key is
# accepted (and refused once that key is dropped); a token for a string user id (a UUID, one of
# every allowed kind of character) is accepted for that id exactly, and refused for the id in
# another case, with leading zeros or as a prefix. Fresh random secrets each run.
set -euo pipefail
cd "$(dirname "$0")"
vq=$(realpath "$1")
servlet_jar=${2:-/usr/share/java/jakarta-servlet-api.jar}

classes=$(mktemp -d "${TMPDIR:-/tmp}/vq-java.XXXXXX")
trap 'rm -rf "$classes"' EXIT
# shellcheck disable=SC2046 # the source paths hold no spaces
javac --release 11 -d "$classes" -cp "$servlet_jar" $(find java/src/main -name '*.java')

new=$(head -c 32 /dev/urandom | base64)
old=$(head -c 32 /dev/urandom | base64)
failures=0

# verify WHICH TYPE ID USER TOKEN: "<exit> <output>" of one verifier (keys from the environment)
verify() {
  local which=$1 out code=0; shift
  case $which in
    node) out=$(node node/bin/vq-verify.js "$@" 2>&1) || code=$? ;;
    python) out=$(cd python && python3 -m vq_token "$@" 2>&1) || code=$? ;;
    java) out=$(java -cp "$classes" vq.token.VerifyCli "$@" 2>&1) || code=$? ;;
  esac
  echo "$code $out"
}

# expect WANT(valid|reason) WHAT TYPE ID USER TOKEN, with the keys in the environment
expect() {
  local want=$1 what=$2 which got; shift 2
  for which in node python java; do
    got=$(verify "$which" "$@")
    local pattern="1 *$want*"
    # Valid: and the verdict names the user (no user id holds a glob character).
    [ "$want" != valid ] || pattern="0 *$3*"
    # shellcheck disable=SC2053 # a glob on purpose
    if [[ $got == $pattern ]]; then
      echo "ok   $which: $what"
    else
      echo "FAIL $which: $what: wanted $want, got: $got"
      failures=$((failures + 1))
    fi
  done
}

token=$(VQ_TOKEN_SECRET=$new "$vq" mint --target limited-drop:42 --user 7)
expired=$(VQ_TOKEN_SECRET=$new "$vq" mint --target limited-drop:42 --user 7 --ttl 0)
by_old=$(VQ_TOKEN_SECRET=$old "$vq" mint --target ticketing-event:9 --user 3)
uuid=3f2a9c1e-7b4d-4c1e-9a8f-2b6c1d0e9f3a
for_uuid=$(VQ_TOKEN_SECRET=$new "$vq" mint --target limited-drop:42 --user "$uuid")
odd='Ab9-_.:@+'
for_odd=$(VQ_TOKEN_SECRET=$new "$vq" mint --target limited-drop:42 --user "$odd")
# vq itself agrees on the tokens it signed (a sanity check of this script).
VQ_TOKEN_SECRET=$new "$vq" verify "$token" --target limited-drop:42 --user 7 >/dev/null
VQ_TOKEN_SECRET=$new "$vq" verify "$for_uuid" --target limited-drop:42 --user "$uuid" >/dev/null

export VQ_TOKEN_SECRET=$new
expect valid "vq mint's token" LIMITED_DROP 42 7 "$token"
expect wrong_user "vq mint's token, for another user" LIMITED_DROP 42 8 "$token"
expect wrong_target "vq mint's token, for another target" LIMITED_DROP 43 7 "$token"
expect wrong_type "vq mint's token, for another type" TICKETING_EVENT 42 7 "$token"
expect expired "vq mint --ttl 0" LIMITED_DROP 42 7 "$expired"
expect bad_signature "signed with a key the verifier does not hold" TICKETING_EVENT 9 3 "$by_old"
expect wrong_user "vq mint's token for user 7, for user 007" LIMITED_DROP 42 007 "$token"
expect no_user "vq mint's token, for a user id with a space" LIMITED_DROP 42 "7 8" "$token"
expect valid "vq mint's token for a UUID user" LIMITED_DROP 42 "$uuid" "$for_uuid"
expect wrong_user "vq mint's token for a UUID user, for it in upper case" LIMITED_DROP 42 "${uuid^^}" "$for_uuid"
expect wrong_user "vq mint's token for a UUID user, for its prefix" LIMITED_DROP 42 "${uuid%-*}" "$for_uuid"
expect wrong_user "vq mint's token for user 7, for a UUID user" LIMITED_DROP 42 "$uuid" "$token"
expect valid "vq mint's token for user $odd" LIMITED_DROP 42 "$odd" "$for_odd"
expect wrong_user "vq mint's token for user $odd, for Ab9" LIMITED_DROP 42 Ab9 "$for_odd"
export VQ_TOKEN_SECRET_PREVIOUS=$old
expect valid "signed with the previous key, during a rotation" TICKETING_EVENT 9 3 "$by_old"
expect valid "signed with the current key, during a rotation" LIMITED_DROP 42 7 "$token"
expect wrong_user "signed with the previous key, for another user" TICKETING_EVENT 9 4 "$by_old"

[ "$failures" = 0 ] || { echo "$failures verdicts differ from vq's"; exit 1; }
