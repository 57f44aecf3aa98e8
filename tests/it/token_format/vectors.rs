//! The generator of the shared test vectors (`clients/test-vectors.json`): `cargo test --test
//! it -- --ignored write_shared_token_vectors` rewrites the file from vq's own mint, asserting
//! every case's intended verdict first.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use vq::token::{self, Secret};

use super::{VECTORS, secret_rule_verdict, vq_verdict};

const V_CURRENT: &str = "vq-vectors-current-key-7d1f0c93a4be2265";
/// Not ASCII, and longer than HMAC-SHA256's 64-byte block (the key is hashed first): the key
/// is the secret's UTF-8 bytes, whatever their length.
const V_PREVIOUS: &str = "vq-vectors-prévious-kéy-ünïcode-and-longer-than-one-64-byte-hmac-block-5b8e";
const V_UNKNOWN: &str = "vq-vectors-unknown-key-e0a94f1b37c2d658";
const V_NOW: u64 = 1_767_225_300;
const V_EXP: u64 = V_NOW + 300;

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// A token over any payload bytes (the malformed ones `token::mint` cannot make).
fn signed(key: &str, payload: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key.as_bytes()).expect("hmac takes any key");
    mac.update(payload);
    format!("{}.{}", b64(payload), b64(&mac.finalize().into_bytes()))
}

fn minted(key: &str, target: &str, user: u64, now: u64, ttl: u64) -> String {
    minted_for(key, target, &user.to_string(), now, ttl)
}

fn minted_for(key: &str, target: &str, user: &str, now: u64, ttl: u64) -> String {
    let secret = Secret::from_source(key.as_bytes().to_vec(), "vectors").unwrap();
    token::mint(&secret, target.parse().unwrap(), &user.parse().unwrap(), now, ttl).raw
}

/// Flips the lowest bit of the last base64url character: with no padding the last character
/// carries 2 or 4 unused bits, so the bytes decode the same but the encoding is not canonical.
fn dirty_last(s: &str) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let last = *s.as_bytes().last().unwrap();
    let v = ALPHABET.iter().position(|c| *c == last).unwrap();
    format!("{}{}", &s[..s.len() - 1], ALPHABET[v ^ 1] as char)
}

struct V {
    name: &'static str,
    token: String,
    keys: &'static [&'static str],
    expect: [String; 3],
    now: u64,
    verdict: &'static str,
}

fn v(name: &'static str, token: String, expect: [&str; 3], verdict: &'static str) -> V {
    V { name, token, keys: &["current"], expect: expect.map(str::to_owned), now: V_NOW, verdict }
}

impl V {
    fn rotation(mut self) -> Self {
        self.keys = &["current", "previous"];
        self
    }
    fn at(mut self, now: u64) -> Self {
        self.now = now;
        self
    }
}

const UUID: &str = "3f2a9c1e-7b4d-4c1e-9a8f-2b6c1d0e9f3a";

fn vector_cases() -> Vec<V> {
    const E: [&str; 3] = ["LIMITED_DROP", "42", "7"];
    let good = minted(V_CURRENT, "LIMITED_DROP:42", 7, V_NOW, 300);
    let (p64, s64) = good.split_once('.').unwrap();
    let sig = URL_SAFE_NO_PAD.decode(s64).unwrap();
    let with_sig = |payload: &str, sig: &[u8]| format!("{}.{}", b64(payload.as_bytes()), b64(sig));
    let cur = |payload: &str| signed(V_CURRENT, payload.as_bytes());
    let mut flipped = sig.clone();
    flipped[0] ^= 0x01;
    // A signature whose base64url holds `-` or `_`, to spell it in standard base64.
    let std_alphabet =
        (7..).map(|u| minted(V_CURRENT, "LIMITED_DROP:42", u, V_NOW, 300)).find(|t| t.contains(['-', '_'])).unwrap();
    let std_user = {
        let payload = URL_SAFE_NO_PAD.decode(std_alphabet.split_once('.').unwrap().0).unwrap();
        String::from_utf8(payload).unwrap().split('|').nth(2).unwrap().to_owned()
    };
    let exp = |s: &str| format!("LIMITED_DROP|42|7|{s}");
    vec![
        v("valid", good.clone(), E, "valid"),
        v("valid one second before it expires", good.clone(), E, "valid").at(V_EXP - 1),
        v("expired at exactly its expiry", good.clone(), E, "expired").at(V_EXP),
        v("expired long ago", good.clone(), E, "expired").at(V_EXP + 86_400),
        v("expected type given as the URL slug", good.clone(), ["limited-drop", "42", "7"], "valid"),
        v("expected id with leading zeros", good.clone(), ["LIMITED_DROP", "042", "7"], "valid"),
        v("expected user with leading zeros: another user", good.clone(), ["LIMITED_DROP", "42", "007"], "wrong_user"),
        v(
            "ticketing event",
            minted(V_CURRENT, "TICKETING_EVENT:9", 3, V_NOW, 60),
            ["TICKETING_EVENT", "9", "3"],
            "valid",
        ),
        v("for another user", good.clone(), ["LIMITED_DROP", "42", "8"], "wrong_user"),
        v("for another target id", good.clone(), ["LIMITED_DROP", "43", "7"], "wrong_target"),
        v("for another type", good.clone(), ["TICKETING_EVENT", "42", "7"], "wrong_type"),
        v(
            "target ids that differ only past 2^53",
            minted(V_CURRENT, "LIMITED_DROP:9007199254740993", 7, V_NOW, 300),
            ["LIMITED_DROP", "9007199254740992", "7"],
            "wrong_target",
        ),
        v(
            "user ids that differ only past 2^53",
            minted(V_CURRENT, "LIMITED_DROP:42", 9_007_199_254_740_993, V_NOW, 300),
            ["LIMITED_DROP", "42", "9007199254740992"],
            "wrong_user",
        ),
        v(
            "largest ids",
            minted(V_CURRENT, "LIMITED_DROP:18446744073709551615", u64::MAX, V_NOW, 300),
            ["LIMITED_DROP", "18446744073709551615", "18446744073709551615"],
            "valid",
        ),
        v(
            "expired and for another user: expiry is checked first",
            good.clone(),
            ["LIMITED_DROP", "42", "8"],
            "expired",
        )
        .at(V_EXP),
        v("another type and id: the type is named", good.clone(), ["TICKETING_EVENT", "43", "7"], "wrong_type"),
        v("another target and user: the target is named", good.clone(), ["LIMITED_DROP", "43", "8"], "wrong_target"),
        v("tampered signature (one bit)", with_sig(&exp(&V_EXP.to_string()), &flipped), E, "bad_signature"),
        v("truncated signature (31 bytes)", with_sig(&exp(&V_EXP.to_string()), &sig[..31]), E, "bad_signature"),
        v("empty signature", format!("{p64}."), E, "bad_signature"),
        v(
            "tampered payload: another user, same signature",
            with_sig("LIMITED_DROP|42|8|1767225600", &sig),
            ["LIMITED_DROP", "42", "8"],
            "bad_signature",
        ),
        v(
            "tampered payload: later expiry, same signature",
            with_sig("LIMITED_DROP|42|7|1767229200", &sig),
            E,
            "bad_signature",
        ),
        v(
            "bad signature and expired: the signature is checked first",
            with_sig(&exp(&V_EXP.to_string()), &flipped),
            E,
            "bad_signature",
        )
        .at(V_EXP + 1),
        v("signed with an unknown key", minted(V_UNKNOWN, "LIMITED_DROP:42", 7, V_NOW, 300), E, "bad_signature")
            .rotation(),
        v(
            "signed with the previous key, during a rotation",
            minted(V_PREVIOUS, "LIMITED_DROP:42", 7, V_NOW, 300),
            E,
            "valid",
        )
        .rotation(),
        v("signed with the current key, during a rotation", good.clone(), E, "valid").rotation(),
        v(
            "signed with the previous key, after the rotation",
            minted(V_PREVIOUS, "LIMITED_DROP:42", 7, V_NOW, 300),
            E,
            "bad_signature",
        ),
        v("signed with the previous key, expired", minted(V_PREVIOUS, "LIMITED_DROP:42", 7, V_NOW, 300), E, "expired")
            .rotation()
            .at(V_EXP),
        v("no user id", good.clone(), ["LIMITED_DROP", "42", ""], "no_user"),
        v("user id 0: another user", good.clone(), ["LIMITED_DROP", "42", "0"], "wrong_user"),
        v("user id with a plus sign: another user", good.clone(), ["LIMITED_DROP", "42", "+7"], "wrong_user"),
        v("user id 7.0: another user", good.clone(), ["LIMITED_DROP", "42", "7.0"], "wrong_user"),
        v(
            "user id past 64 bits: another user",
            good.clone(),
            ["LIMITED_DROP", "42", "18446744073709551616"],
            "wrong_user",
        ),
        v("user id with a space", good.clone(), ["LIMITED_DROP", "42", "7 "], "no_user"),
        v("user id with a |", good.clone(), ["LIMITED_DROP", "42", "7|8"], "no_user"),
        v("user id with a {", good.clone(), ["LIMITED_DROP", "42", "{7}"], "no_user"),
        v("user id with a /", good.clone(), ["LIMITED_DROP", "42", "a/7"], "no_user"),
        v("user id with a non-ASCII letter", good.clone(), ["LIMITED_DROP", "42", "\u{e9}7"], "no_user"),
        v("user id in full-width digits", good.clone(), ["LIMITED_DROP", "42", "\u{ff17}"], "no_user"),
        v("user id of 129 characters", good.clone(), ["LIMITED_DROP", "42", &"7".repeat(129)], "no_user"),
        v(
            "a UUID user id",
            minted_for(V_CURRENT, "LIMITED_DROP:42", UUID, V_NOW, 300),
            ["LIMITED_DROP", "42", UUID],
            "valid",
        ),
        v(
            "a UUID user id in upper case: another user",
            minted_for(V_CURRENT, "LIMITED_DROP:42", UUID, V_NOW, 300),
            ["LIMITED_DROP", "42", &UUID.to_uppercase()],
            "wrong_user",
        ),
        v(
            "a string user id",
            minted_for(V_CURRENT, "LIMITED_DROP:42", "user_8f3k", V_NOW, 300),
            ["LIMITED_DROP", "42", "user_8f3k"],
            "valid",
        ),
        v(
            "a user id of every allowed kind of character",
            minted_for(V_CURRENT, "LIMITED_DROP:42", "Ab9-_.:@+", V_NOW, 300),
            ["LIMITED_DROP", "42", "Ab9-_.:@+"],
            "valid",
        ),
        v(
            "a user id of 128 characters",
            minted_for(V_CURRENT, "LIMITED_DROP:42", &"u".repeat(128), V_NOW, 300),
            ["LIMITED_DROP", "42", &"u".repeat(128)],
            "valid",
        ),
        v(
            "a string user id and another that extends it",
            minted_for(V_CURRENT, "LIMITED_DROP:42", "user_8f3k", V_NOW, 300),
            ["LIMITED_DROP", "42", "user_8f3k:"],
            "wrong_user",
        ),
        v("no token", String::new(), E, "missing"),
        v("no token and no user: the user is named", String::new(), ["LIMITED_DROP", "42", ""], "no_user"),
        v("expected type not a type", good.clone(), ["SHOE$", "42", "7"], "invalid_target"),
        v("expected type in mixed case", good.clone(), ["Limited-Drop", "42", "7"], "invalid_target"),
        v(
            "a type the operator configured (any well-formed name)",
            minted(V_CURRENT, "FLASH_COUPON2:5", 7, V_NOW, 300),
            ["flash-coupon2", "5", "7"],
            "valid",
        ),
        v(
            "the longest type (32 characters)",
            minted(V_CURRENT, &format!("{}:5", "A".repeat(32)), 7, V_NOW, 300),
            [&"a".repeat(32), "5", "7"],
            "valid",
        ),
        v("expected another well-formed type", good.clone(), ["FLASH_COUPON", "42", "7"], "wrong_type"),
        v("expected target id 0", good.clone(), ["LIMITED_DROP", "0", "7"], "invalid_target"),
        v("expected target id not a number", good.clone(), ["LIMITED_DROP", "4x", "7"], "invalid_target"),
        v("no separator", "garbage".into(), E, "malformed"),
        v("payload padded with =", format!("{p64}=.{s64}"), E, "malformed"),
        v("signature padded with =", format!("{good}="), E, "malformed"),
        v("payload with non-zero unused bits", format!("{}.{s64}", dirty_last(p64)), E, "malformed"),
        v("signature with non-zero unused bits", format!("{p64}.{}", dirty_last(s64)), E, "malformed"),
        v(
            "signature in standard base64 (+ /)",
            std_alphabet.replace('-', "+").replace('_', "/"),
            ["LIMITED_DROP", "42", &std_user],
            "malformed",
        ),
        v("signature of 33 bytes (one more character)", format!("{good}A"), E, "bad_signature"),
        v("signature of an impossible length (two more characters)", format!("{good}AA"), E, "malformed"),
        v("a second separator", format!("{good}.x"), E, "malformed"),
        v("surrounding whitespace", format!(" {good}"), E, "malformed"),
        v("trailing newline", format!("{good}\n"), E, "malformed"),
        v("payload not UTF-8 (signed)", signed(V_CURRENT, b"LIMITED_DROP|42|7|\xff"), E, "malformed"),
        v(
            "payload with an encoded surrogate (signed)",
            signed(V_CURRENT, b"LIMITED_DROP|42|\xed\xa0\x80|1767225600"),
            E,
            "malformed",
        ),
        v("payload with a byte-order mark (signed)", cur("\u{feff}LIMITED_DROP|42|7|1767225600"), E, "malformed"),
        v("three fields (signed)", cur("LIMITED_DROP|42|7"), E, "malformed"),
        v("five fields: a trailing | (signed)", cur("LIMITED_DROP|42|7|1767225600|"), E, "malformed"),
        v("malformed is said before a bad signature", with_sig("LIMITED_DROP|42|7", &sig), E, "malformed"),
        v("type as the URL slug (signed)", cur("limited-drop|42|7|1767225600"), E, "malformed"),
        v("type in lower case (signed)", cur("limited_drop|42|7|1767225600"), E, "malformed"),
        v("type with a trailing _ (signed)", cur("LIMITED_DROP_|42|7|1767225600"), E, "malformed"),
        v("type with a doubled _ (signed)", cur("LIMITED__DROP|42|7|1767225600"), E, "malformed"),
        v("type starting with a digit (signed)", cur("1DROP|42|7|1767225600"), E, "malformed"),
        v("type with a trailing newline (signed)", cur("LIMITED_DROP\n|42|7|1767225600"), E, "malformed"),
        v("type of 33 characters (signed)", cur(&format!("{}|42|7|1767225600", "A".repeat(33))), E, "malformed"),
        v("type empty (signed)", cur("|42|7|1767225600"), E, "malformed"),
        v("target id 0 (signed)", cur("LIMITED_DROP|0|7|1767225600"), ["LIMITED_DROP", "1", "7"], "malformed"),
        v("target id with a plus sign (signed)", cur("LIMITED_DROP|+42|7|1767225600"), E, "malformed"),
        v("target id empty (signed)", cur("LIMITED_DROP||7|1767225600"), E, "malformed"),
        v("target id past 64 bits (signed)", cur("LIMITED_DROP|18446744073709551616|7|1767225600"), E, "malformed"),
        v("target id in Arabic-Indic digits (signed)", cur("LIMITED_DROP|\u{664}\u{662}|7|1767225600"), E, "malformed"),
        v("user id 0 (signed): another user", cur("LIMITED_DROP|42|0|1767225600"), E, "wrong_user"),
        v("user id -7 (signed): another user", cur("LIMITED_DROP|42|-7|1767225600"), E, "wrong_user"),
        v("user id empty (signed)", cur("LIMITED_DROP|42||1767225600"), E, "malformed"),
        v("user id with a trailing space (signed)", cur("LIMITED_DROP|42|7 |1767225600"), E, "malformed"),
        v("user id with a { (signed)", cur("LIMITED_DROP|42|{7}|1767225600"), E, "malformed"),
        v("user id in full-width digits (signed)", cur("LIMITED_DROP|42|\u{ff17}|1767225600"), E, "malformed"),
        v(
            "user id of 129 characters (signed)",
            cur(&format!("LIMITED_DROP|42|{}|1767225600", "7".repeat(129))),
            E,
            "malformed",
        ),
        v(
            "a token for user a|b cannot be read as one for a (signed)",
            cur("LIMITED_DROP|42|a|b|1767225600"),
            ["LIMITED_DROP", "42", "a"],
            "malformed",
        ),
        v(
            "target id with an underscore (signed)",
            cur("LIMITED_DROP|1_2|7|1767225600"),
            ["LIMITED_DROP", "12", "7"],
            "malformed",
        ),
        v(
            "user and target ids with leading zeros (signed)",
            cur("LIMITED_DROP|0042|007|1767225600"),
            ["LIMITED_DROP", "42", "007"],
            "valid",
        ),
        v("expiry empty (signed)", cur(&exp("")), E, "malformed"),
        v("expiry negative (signed)", cur(&exp("-1")), E, "malformed"),
        v("expiry in exponent notation (signed)", cur(&exp("1.8e9")), E, "malformed"),
        v("expiry in hexadecimal (signed)", cur(&exp("0x70000000")), E, "malformed"),
        v("expiry with a leading space (signed)", cur(&exp(" 1767225600")), E, "malformed"),
        v("expiry past 64 bits (signed)", cur(&exp("18446744073709551616")), E, "malformed"),
        v("expiry with a plus sign (signed): accepted, as Rust parses it", cur(&exp("+1767225600")), E, "valid"),
        v("expiry with leading zeros (signed)", cur(&exp("0001767225600")), E, "valid"),
        v("expiry after 4400 zeros (signed)", cur(&exp(&format!("{}{V_EXP}", "0".repeat(4400)))), E, "valid"),
        v(
            "user id after 30 zeros (signed): another user than 7",
            cur(&format!("LIMITED_DROP|42|{}7|{V_EXP}", "0".repeat(30))),
            E,
            "wrong_user",
        ),
        v("expiry of 4400 digits (signed)", cur(&exp(&"9".repeat(4400))), E, "malformed"),
        v("expiry 0 (signed)", cur(&exp("0")), E, "expired"),
        v("expiry the largest 64-bit value (signed)", cur(&exp("18446744073709551615")), E, "valid"),
    ]
}

/// Secrets vq refuses at start (`Secret::from_source`), which the clients refuse too.
fn secret_rules() -> Vec<(&'static str, String)> {
    vec![
        ("32 ASCII bytes", "0123456789abcdef0123456789abcdef".into()),
        ("31 bytes", "0123456789abcdef0123456789abcde".into()),
        ("16 characters but 32 UTF-8 bytes", "αβγδεζηθικλμνξοπ".into()),
        ("only spaces", " ".repeat(40)),
        ("only ASCII whitespace", " \t\n\r\x0c".repeat(8)),
        ("a vertical tab is not whitespace to vq", format!("\x0b{}", " \t\n\r".repeat(8))),
        ("one character repeated", "x".repeat(64)),
        ("7 distinct bytes", "passwordpasswordpasswordpassword".into()),
        ("8 distinct bytes", "abcdefghabcdefghabcdefghabcdefgh".into()),
        ("16 é: 32 bytes, 2 distinct", "é".repeat(16)),
    ]
}

fn generate_vectors() -> Value {
    let mut file = json!({
        "about": "Entry-token verdicts every verifier must give: vq's (tests/it/token_format.rs checks \
                  them) and each client's in clients/. A case: the token, the keys the verifier holds \
                  (secrets by name; the key is the secret's UTF-8 bytes), what the request expects \
                  (type and id as a route gives them, the id in decimal; the user as X-User-Id gives \
                  it: 1 to 128 characters, each a letter, a digit or one of - _ . : @ +, compared \
                  as is), now (epoch seconds), and the verdict: valid (with the key that signed and \
                  the claims) or the reason with vq's detail text. invalid_target: the expected type \
                  or id is not one, the caller's error (vq answers 400). secretRules: secrets a \
                  verifier must refuse, as vq refuses them at start. Every number is a string.",
        "regenerate": "cargo test --test it -- --ignored write_shared_token_vectors",
        "secrets": { "current": V_CURRENT, "previous": V_PREVIOUS, "unknown": V_UNKNOWN },
        "cases": [],
        "secretRules": [],
    });
    let cases = vector_cases();
    for c in &cases {
        let mut case = json!({
            "name": c.name,
            "token": c.token,
            "keys": c.keys,
            "expect": { "type": c.expect[0], "id": c.expect[1], "user": c.expect[2] },
            "now": c.now.to_string(),
        });
        let verdict = vq_verdict(&file, &case);
        assert_eq!(verdict["verdict"], c.verdict, "{}: vq says {verdict}", c.name);
        case.as_object_mut().unwrap().extend(verdict.as_object().unwrap().clone());
        file["cases"].as_array_mut().unwrap().push(case);
    }
    for (name, secret) in secret_rules() {
        let verdict = secret_rule_verdict(&secret);
        file["secretRules"].as_array_mut().unwrap().push(json!({ "name": name, "secret": secret, "verdict": verdict }));
    }
    file
}

#[test]
#[ignore = "writes clients/test-vectors.json: run on purpose"]
fn write_shared_token_vectors() {
    let text = serde_json::to_string_pretty(&generate_vectors()).unwrap() + "\n";
    std::fs::write(VECTORS, text).unwrap();
}
