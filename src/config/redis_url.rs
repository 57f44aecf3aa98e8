//! The one home of credential redaction: a Redis URL prints with its password as `***`.

use serde::{Deserialize, Serialize};

/// A Redis URL that may carry credentials (`redis://user:password@host`). Its `Display` and
/// `Debug` print them as `***`, so every message, log line and screen that formats the URL
/// shows it redacted; the connection code reads the raw text through `Deref<Target = str>`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RedisUrl(String);

impl std::ops::Deref for RedisUrl {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl From<String> for RedisUrl {
    fn from(s: String) -> Self {
        Self(s)
    }
}

impl From<&str> for RedisUrl {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

impl PartialEq<&str> for RedisUrl {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl std::fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&redact_credentials(&self.0))
    }
}

impl std::fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", redact_credentials(&self.0))
    }
}

/// Replaces the password of every URL in `text` (one URL or a comma-separated list) by `***`:
/// `redis://user:pw@host` → `redis://user:***@host`, `redis://pw@host` → `redis://***@host`
/// (a lone user part is often a password), and `pass=`/`password=` query values likewise.
pub fn redact_credentials(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (i, item) in text.split(',').enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&redact_one(item));
    }
    out
}

fn redact_one(url: &str) -> String {
    let Some(start) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let (head, rest) = url.split_at(start);
    // The last `@` ends the user info: a password may hold `@`, `/` or `?` unencoded.
    let rest = match rest.rfind('@') {
        Some(at) => {
            let (info, host) = rest.split_at(at);
            match info.split_once(':') {
                Some((user, _)) => format!("{user}:***{host}"),
                None => format!("***{host}"),
            }
        }
        None => rest.to_owned(),
    };
    let rest = match rest.split_once('?') {
        Some((path, query)) => {
            let params: Vec<String> = query
                .split('&')
                .map(|p| match p.split_once('=') {
                    Some((k, _)) if k.eq_ignore_ascii_case("pass") || k.eq_ignore_ascii_case("password") => {
                        format!("{k}=***")
                    }
                    _ => p.to_owned(),
                })
                .collect();
            format!("{path}?{}", params.join("&"))
        }
        None => rest,
    };
    format!("{head}{rest}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_in_redis_urls_are_redacted() {
        for (raw, shown) in [
            ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
            ("redis://user:hunter2@10.0.0.1:6379/0", "redis://user:***@10.0.0.1:6379/0"),
            ("redis://:hunter2@h:1", "redis://:***@h:1"),
            ("rediss://hunter2@h:1", "rediss://***@h:1"),
            ("redis://u:hun@ter/2?@h:1", "redis://u:***@h:1"),
            ("redis+unix:///tmp/r.sock?db=1&pass=hunter2", "redis+unix:///tmp/r.sock?db=1&pass=***"),
            ("redis://:a@h:1, redis://:b@g:2", "redis://:***@h:1, redis://:***@g:2"),
        ] {
            assert_eq!(redact_credentials(raw), shown);
            let url = RedisUrl::from(raw);
            assert_eq!(url.to_string(), shown);
            assert!(!format!("{url:?}").contains("hunter2"));
            assert_eq!(&*url, raw, "the connection code sees the raw URL");
        }
    }
}
