//! `vq mint` and `vq verify`: create a token; decode one and say why it fails.

use std::process::ExitCode;

use crate::clock::now_epoch_ms;
use crate::config::secret_from_env;
use crate::domain::format_instant;
use crate::domain::{QueueTarget, UserId};
use crate::token::{self, KeyUsed, SecretError, TokenError};

#[derive(clap::Args)]
#[command(after_help = "Example:\n  VQ_TOKEN_SECRET=… vq mint --target limited-drop:42 --user 7 --json")]
pub struct MintArgs {
    /// Target, e.g. limited-drop:42
    #[arg(long, value_name = "T")]
    target: QueueTarget,
    /// User id
    #[arg(long, value_name = "ID")]
    user: UserId,
    /// Lifetime in seconds, up to 86400 (0 mints an expired token, to try the gate's refusal)
    #[arg(long, value_name = "SECONDS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(0..=*crate::config::TOKEN_TTL_S.end()))]
    ttl: u64,
    /// Print the token with its fields as JSON
    #[arg(long)]
    json: bool,
}

pub fn mint(a: MintArgs) -> anyhow::Result<ExitCode> {
    let secret = secret_from_env()?;
    let now = now_epoch_ms() / 1000;
    let t = token::mint(&secret, a.target, &a.user, now, a.ttl);
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "token": t.raw, "targetType": a.target.kind.as_str(), "targetId": a.target.id,
                "userId": a.user.as_str(), "expiresAt": t.expires_at, "expiresAtIso": format_instant(t.expires_at * 1000),
            })
        );
    } else {
        println!("{}", t.raw);
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args)]
#[command(
    after_help = "Exit status: 0 valid, 1 invalid, 2 usage.\nExample:\n  vq verify \"$TOKEN\" --target limited-drop:42 --user 7"
)]
pub struct VerifyArgs {
    /// The token (X-Entry-Token)
    token: String,
    /// Check it is for this target
    #[arg(long, value_name = "T")]
    target: Option<QueueTarget>,
    /// Check it is for this user
    #[arg(long, value_name = "ID")]
    user: Option<UserId>,
    /// Print the verdict as JSON
    #[arg(long)]
    json: bool,
}

pub fn verify(a: VerifyArgs) -> anyhow::Result<ExitCode> {
    let now = now_epoch_ms() / 1000;
    let claims = match token::decode(&a.token) {
        Ok((c, _, _)) => c,
        Err(e) => return Ok(report(&a, None, Some(e), false, None)),
    };
    // No secret at all: decode and explain. A secret that is set but unusable is an error.
    let secret = match secret_from_env() {
        Ok(s) => Some(s),
        Err(SecretError::Missing) => None,
        Err(e) => return Err(e.into()),
    };
    let checked = secret.is_some();
    let (key, signature_error) = match &secret {
        Some(s) => match token::verify_signature_with_key(s, &a.token) {
            Ok((_, used)) => (Some(used), None),
            Err(e) => (None, Some(e)),
        },
        None => (None, None),
    };
    let verdict = signature_error
        .or_else(|| (claims.expires_at <= now).then_some(TokenError::Expired { at: claims.expires_at }))
        .or_else(|| {
            let t = a.target?;
            if t.kind != claims.target.kind {
                Some(TokenError::WrongType { expected: t.kind, actual: claims.target.kind })
            } else {
                (t != claims.target).then_some(TokenError::WrongTarget { expected: t, actual: claims.target })
            }
        })
        .or_else(|| (a.user.as_ref().is_some_and(|u| *u != claims.user)).then_some(TokenError::WrongUser));
    Ok(report(&a, Some(claims), verdict, checked, key))
}

/// Without the secret a token is decoded and explained, but never called valid.
fn proven(err: Option<&TokenError>, signature_checked: bool) -> bool {
    err.is_none() && signature_checked
}

fn report(
    a: &VerifyArgs,
    claims: Option<token::TokenClaims>,
    err: Option<TokenError>,
    signature_checked: bool,
    key: Option<KeyUsed>,
) -> ExitCode {
    let valid = proven(err.as_ref(), signature_checked);
    if a.json {
        let mut v = serde_json::json!({ "valid": valid, "signatureChecked": signature_checked });
        if let Some(k) = key {
            v["key"] = k.as_str().into();
        }
        if let Some(c) = claims {
            v["targetType"] = c.target.kind.as_str().into();
            v["targetId"] = c.target.id.into();
            v["userId"] = c.user.as_str().into();
            v["expiresAt"] = c.expires_at.into();
            v["expiresAtIso"] = format_instant(c.expires_at * 1000).into();
        }
        if let Some(e) = &err {
            v["reason"] = e.to_string().into();
        }
        println!("{v}");
    } else {
        if let Some(c) = &claims {
            println!("target:  {}", c.target);
            println!("user:    {}", c.user);
            println!("expires: {} ({})", format_instant(c.expires_at * 1000), c.expires_at);
        }
        if !signature_checked && claims.is_some() {
            println!("signature: NOT CHECKED (VQ_TOKEN_SECRET is not set)");
        }
        match key {
            Some(KeyUsed::Current) => println!("signed:  with the current key (VQ_TOKEN_SECRET)"),
            Some(KeyUsed::Previous) => println!("signed:  with the previous key (VQ_TOKEN_SECRET_PREVIOUS)"),
            None => {}
        }
        match &err {
            None if valid => println!("valid"),
            None => println!("not proven valid: the signature was not checked"),
            Some(e) => println!("invalid: {e}"),
        }
    }
    if valid { ExitCode::SUCCESS } else { ExitCode::from(1) }
}
