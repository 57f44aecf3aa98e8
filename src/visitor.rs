//! Visitor ids (`identity.mode = "visitor"`): vq names each anonymous visitor with a random id
//! and hands it back signed, `id "." base64url(HMAC-SHA256(secret, "vq-visitor|" id))`, in an
//! HttpOnly cookie (and as `visitorToken`, for apps that keep no cookies). The signature is
//! checked as an entry token's, with the current key and during a rotation the previous one; a
//! forged or altered visitor token names nobody, so its bearer is a new visitor. Pure: the
//! caller draws the randomness.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use crate::domain::UserId;
use crate::token::Secret;

/// The cookie that holds the visitor token.
pub const COOKIE: &str = "vq_visitor";
/// The header an app without cookies sends the visitor token in.
pub const HEADER: &str = "x-visitor-token";

/// A visitor's id from 16 random bytes: `v_` and 22 base64url characters, inside the user id
/// rule, and never an id a shop's proxy would send.
pub fn new_id(random: [u8; 16]) -> UserId {
    format!("v_{}", URL_SAFE_NO_PAD.encode(random)).parse().expect("v_ and base64url are user id characters")
}

fn payload(id: &str) -> Vec<u8> {
    [b"vq-visitor|".as_slice(), id.as_bytes()].concat()
}

/// The visitor token of `id`, signed with the current key.
pub fn sign(secret: &Secret, id: &UserId) -> String {
    format!("{id}.{}", URL_SAFE_NO_PAD.encode(secret.sign(&payload(id.as_str()))))
}

/// The visitor a token names, if one of the keys signed it.
pub fn verify(secret: &Secret, raw: &str) -> Option<UserId> {
    let (id, sig) = raw.rsplit_once('.')?;
    let id: UserId = id.parse().ok()?;
    let sig = URL_SAFE_NO_PAD.decode(sig).ok()?;
    secret.signed(&payload(id.as_str()), &sig).then_some(id)
}

/// The visitor token in a `Cookie` header's value, if the cookie is there.
pub fn from_cookie_header(value: &str) -> impl Iterator<Item = &str> {
    value.split(';').filter_map(|pair| pair.trim().strip_prefix(COOKIE)?.strip_prefix('='))
}

/// The `Set-Cookie` value that gives a visitor their token.
pub fn set_cookie(token: &str, max_age_s: u64, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!("{COOKIE}={token}; Path=/; Max-Age={max_age_s}; HttpOnly; SameSite=Lax{secure}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(b: u8) -> Secret {
        Secret::new(vec![b; 40]).unwrap()
    }

    #[test]
    fn a_signed_visitor_verifies_and_an_altered_one_names_nobody() {
        let (s, id) = (secret(b'a'), new_id([7; 16]));
        assert!(id.as_str().starts_with("v_") && id.as_str().len() == 24, "{id}");
        let token = sign(&s, &id);
        assert_eq!(verify(&s, &token), Some(id.clone()));
        assert_eq!(verify(&secret(b'b'), &token), None, "another key");
        let other = new_id([8; 16]);
        let (_, sig) = token.rsplit_once('.').unwrap();
        assert_eq!(verify(&s, &format!("{other}.{sig}")), None, "another id, same signature");
        for bad in ["", ".", "v_x", "v_x.", "a|b.AAAA", &token[..token.len() - 1], &format!("{token}A")] {
            assert_eq!(verify(&s, bad), None, "{bad:?}");
        }
        // An entry token's signature is not a visitor's: the payloads differ.
        let entry = crate::token::mint(&s, "LIMITED_DROP:1".parse().unwrap(), &id, 1, 300).raw;
        assert_eq!(verify(&s, &format!("{id}.{}", entry.split_once('.').unwrap().1)), None);
    }

    #[test]
    fn the_previous_key_still_names_its_visitors() {
        let id = new_id([1; 16]);
        let by_old = sign(&secret(b'o'), &id);
        let rotated = secret(b'n').with_previous(secret(b'o')).unwrap();
        assert_eq!(verify(&rotated, &by_old), Some(id.clone()));
        assert_eq!(verify(&secret(b'n'), &by_old), None, "after the rotation");
    }

    #[test]
    fn the_cookie_is_found_among_others() {
        let got: Vec<&str> = from_cookie_header("a=1; vq_visitor=v_x.sig;vq_visitorx=2; b=3").collect();
        assert_eq!(got, ["v_x.sig"]);
        assert!(set_cookie("t", 60, true).ends_with("HttpOnly; SameSite=Lax; Secure"));
    }
}
