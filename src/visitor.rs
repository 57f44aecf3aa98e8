//! Visitor ids (`identity.mode = "visitor"`): vq names each anonymous visitor with a random id
//! and hands it back signed with an expiry, `id "." expires_at "." base64url(HMAC-SHA256(secret,
//! "vq-visitor|" id "|" expires_at))`, in an HttpOnly cookie (and as `visitorToken`, for apps
//! that keep no cookies). The signature is checked as an entry token's, with the current key
//! and during a rotation the previous one, and the expiry (epoch seconds, the cookie's
//! `Max-Age` after it was issued) on every use; a forged, altered or expired visitor token
//! names nobody, so its bearer is a new visitor. A `Secure` cookie is named with the `__Host-`
//! prefix, which a browser takes only over HTTPS, with `Path=/` and without `Domain`: neither a
//! plain-HTTP page nor a sibling subdomain can plant one. Pure: the caller draws the randomness
//! and reads the clock.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use crate::domain::UserId;
use crate::token::Secret;

/// The cookie that holds the visitor token when it is not `Secure` (trials over plain HTTP).
pub const COOKIE: &str = "vq_visitor";
/// The cookie that holds the visitor token when it is `Secure` (the default).
pub const SECURE_COOKIE: &str = "__Host-vq_visitor";
/// The header an app without cookies sends the visitor token in.
pub const HEADER: &str = "x-visitor-token";

/// The visitor cookie's name: [`SECURE_COOKIE`] when `Secure`, else [`COOKIE`]. Only the name
/// vq sets is read back.
pub fn cookie_name(secure: bool) -> &'static str {
    if secure { SECURE_COOKIE } else { COOKIE }
}

/// A visitor's id from 16 random bytes: `v_` and 22 base64url characters, inside the user id
/// rule, and never an id a shop's proxy would send.
pub fn new_id(random: [u8; 16]) -> UserId {
    format!("v_{}", URL_SAFE_NO_PAD.encode(random)).parse().expect("v_ and base64url are user id characters")
}

fn payload(id: &str, expires_at: u64) -> Vec<u8> {
    format!("vq-visitor|{id}|{expires_at}").into_bytes()
}

/// The visitor token of `id`, naming them until `expires_at` (epoch seconds), signed with the
/// current key.
pub fn sign(secret: &Secret, id: &UserId, expires_at: u64) -> String {
    format!("{id}.{expires_at}.{}", URL_SAFE_NO_PAD.encode(secret.sign(&payload(id.as_str(), expires_at))))
}

/// The visitor a token names at `now_s` (epoch seconds), if one of the keys signed it and it
/// has not expired.
pub fn verify(secret: &Secret, raw: &str, now_s: u64) -> Option<UserId> {
    let (rest, sig) = raw.rsplit_once('.')?;
    let (id, expires_at) = rest.rsplit_once('.')?;
    if expires_at.is_empty() || !expires_at.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let expires_at: u64 = expires_at.parse().ok()?;
    let id: UserId = id.parse().ok()?;
    let sig = URL_SAFE_NO_PAD.decode(sig).ok()?;
    (secret.signed(&payload(id.as_str(), expires_at), &sig) && now_s < expires_at).then_some(id)
}

/// The values of the cookie `name` in a `Cookie` header's value.
pub fn from_cookie_header<'a>(value: &'a str, name: &'a str) -> impl Iterator<Item = &'a str> {
    value.split(';').filter_map(move |pair| pair.trim().strip_prefix(name)?.strip_prefix('='))
}

/// The `Set-Cookie` value that gives a visitor their token for `max_age_s`.
pub fn set_cookie(token: &str, max_age_s: u64, secure: bool) -> String {
    let name = cookie_name(secure);
    let secure = if secure { "; Secure" } else { "" };
    format!("{name}={token}; Path=/; Max-Age={max_age_s}; HttpOnly; SameSite=Lax{secure}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000;

    fn secret(b: u8) -> Secret {
        Secret::new(vec![b; 40]).unwrap()
    }

    #[test]
    fn a_signed_visitor_verifies_and_an_altered_one_names_nobody() {
        let (s, id) = (secret(b'a'), new_id([7; 16]));
        assert!(id.as_str().starts_with("v_") && id.as_str().len() == 24, "{id}");
        let token = sign(&s, &id, NOW + 60);
        assert_eq!(verify(&s, &token, NOW), Some(id.clone()));
        assert_eq!(verify(&secret(b'b'), &token, NOW), None, "another key");
        let other = new_id([8; 16]);
        let (_, sig) = token.rsplit_once('.').unwrap();
        assert_eq!(verify(&s, &format!("{other}.{}.{sig}", NOW + 60), NOW), None, "another id, same signature");
        assert_eq!(verify(&s, &format!("{id}.{}.{sig}", NOW + 6000), NOW), None, "a later expiry, same signature");
        for bad in
            ["", ".", "..", "v_x", "v_x.", "v_x..", "a|b.1.AAAA", &token[..token.len() - 1], &format!("{token}A")]
        {
            assert_eq!(verify(&s, bad, NOW), None, "{bad:?}");
        }
        // An entry token's signature is not a visitor's: the payloads differ.
        let entry = crate::token::mint(&s, "LIMITED_DROP:1".parse().unwrap(), &id, 1, 300).raw;
        assert_eq!(verify(&s, &format!("{id}.{}.{}", NOW + 60, entry.split_once('.').unwrap().1), NOW), None);
    }

    #[test]
    fn a_visitor_token_names_nobody_from_its_expiry_on() {
        let (s, id) = (secret(b'a'), new_id([7; 16]));
        let token = sign(&s, &id, NOW + 60);
        assert_eq!(verify(&s, &token, NOW + 59), Some(id));
        assert_eq!(verify(&s, &token, NOW + 60), None, "the cookie's Max-Age has passed");
        assert_eq!(verify(&s, &token, NOW + 86_400), None);
        // The signature before expiries were signed (id "." signature): nobody.
        let id = new_id([9; 16]);
        let sig = URL_SAFE_NO_PAD.encode(s.sign(format!("vq-visitor|{id}").as_bytes()));
        assert_eq!(verify(&s, &format!("{id}.{sig}"), NOW), None);
    }

    #[test]
    fn the_previous_key_still_names_its_visitors() {
        let id = new_id([1; 16]);
        let by_old = sign(&secret(b'o'), &id, NOW + 60);
        let rotated = secret(b'n').with_previous(secret(b'o')).unwrap();
        assert_eq!(verify(&rotated, &by_old, NOW), Some(id.clone()));
        assert_eq!(verify(&secret(b'n'), &by_old, NOW), None, "after the rotation");
    }

    #[test]
    fn the_cookie_is_found_among_others_by_the_name_vq_sets() {
        let header = "a=1; vq_visitor=v_x.1.sig;vq_visitorx=2; __Host-vq_visitor=v_y.1.sig; b=3";
        assert_eq!(from_cookie_header(header, cookie_name(false)).collect::<Vec<_>>(), ["v_x.1.sig"]);
        assert_eq!(from_cookie_header(header, cookie_name(true)).collect::<Vec<_>>(), ["v_y.1.sig"]);
        assert_eq!(
            set_cookie("t", 60, true),
            "__Host-vq_visitor=t; Path=/; Max-Age=60; HttpOnly; SameSite=Lax; Secure"
        );
        assert_eq!(set_cookie("t", 60, false), "vq_visitor=t; Path=/; Max-Age=60; HttpOnly; SameSite=Lax");
    }
}
