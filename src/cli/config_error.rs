//! Configuration errors as an operator reads them: the setting by its key and its `VQ_…`
//! variable, where the value came from, and for a misspelt key the one that was meant.

use figment::error::{Error, Kind};

use crate::config::{ConfigError, env_name};

/// One line per problem, e.g. "unknown setting queue.batch_sise (VQ_QUEUE__BATCH_SISE, in
/// vq.toml); did you mean queue.batch_size?".
pub fn describe(error: &ConfigError) -> String {
    match error {
        ConfigError::Parse(e) => e.clone().into_iter().map(|e| describe_one(&e)).collect::<Vec<_>>().join("\n"),
        checked => checked.to_string(),
    }
}

fn describe_one(e: &Error) -> String {
    let path: Vec<String> = e.path.iter().map(|p| p.to_ascii_lowercase()).collect();
    let key = path.join(".");
    let from = source(e);
    let setting = if key.is_empty() { String::new() } else { format!("{key} ({}{from})", env_name(&key)) };
    match &e.kind {
        Kind::UnknownField(field, expected) => {
            let parent = &path[..path.len().saturating_sub(1)];
            let full = |name: &str| parent.iter().map(String::as_str).chain([name]).collect::<Vec<_>>().join(".");
            match closest(field, expected) {
                Some(meant) => format!("unknown setting {setting}; did you mean {}?", full(meant)),
                None => {
                    let known: Vec<String> = expected.iter().map(|k| full(k)).collect();
                    format!("unknown setting {setting}; known settings here: {}", known.join(", "))
                }
            }
        }
        Kind::UnknownVariant(found, expected) => {
            format!("{setting} must be one of {}, got `{found}`", expected.join(", "))
        }
        Kind::InvalidType(actual, expected) => format!("{setting} must be {}, got {actual}", plain(expected)),
        Kind::InvalidValue(actual, expected) => format!("{setting} must be {}, got {actual}", plain(expected)),
        Kind::Message(m) if key.is_empty() => m.clone(),
        kind if key.is_empty() => kind.to_string(),
        kind => format!("{setting}: {kind}"),
    }
}

/// What serde expects, in an operator's words: "u64" is "a whole number, 0 or more".
fn plain(expected: &str) -> String {
    let range = |max: &str| format!("a whole number from 0 to {max}");
    match expected {
        "u64" | "usize" => "a whole number, 0 or more".to_owned(),
        "u32" => range("4294967295"),
        "u16" => range("65535"),
        "u8" => range("255"),
        "i64" | "i32" | "isize" => "a whole number".to_owned(),
        "f64" | "f32" => "a number".to_owned(),
        "a boolean" | "bool" => "true or false".to_owned(),
        other => other.to_owned(),
    }
}

/// Where the value came from: the file it was read from, or the environment.
fn source(e: &Error) -> String {
    match e.metadata.as_ref() {
        Some(m) => match &m.source {
            Some(figment::Source::File(path)) => format!(", in {}", path.display()),
            _ if m.name.contains("environment") => ", from the environment".to_owned(),
            _ => String::new(),
        },
        None => String::new(),
    }
}

/// The known name a misspelling most likely meant, if one is close enough.
fn closest<'a>(found: &str, known: &[&'a str]) -> Option<&'a str> {
    known
        .iter()
        .map(|k| (strsim::jaro_winkler(found, k), *k))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, k)| k)
}

#[cfg(test)]
#[allow(clippy::result_large_err)] // figment::Jail's closures return figment::Error
mod tests {
    use std::path::Path;

    use figment::Jail;

    use super::*;
    use crate::config::{Overrides, Settings};

    fn load_error() -> String {
        describe(&Settings::load(Some(Path::new("vq.toml")), &Overrides::default()).unwrap_err())
    }

    #[test]
    fn a_misspelt_key_names_the_setting_its_variable_and_what_was_meant() {
        Jail::expect_with(|jail| {
            jail.create_file("vq.toml", "")?;
            jail.set_env("VQ_QUEUE__BATCH_SISE", "5");
            assert_eq!(
                load_error(),
                "unknown setting queue.batch_sise (VQ_QUEUE__BATCH_SISE, from the environment); did you mean queue.batch_size?"
            );
            Ok(())
        });
        Jail::expect_with(|jail| {
            jail.create_file("vq.toml", "[queu]\nbatch_size = 3\n")?;
            let err = load_error();
            assert!(err.starts_with("unknown setting queu (VQ_QUEU, in "), "{err}");
            assert!(err.ends_with("vq.toml); did you mean queue?"), "{err}");
            Ok(())
        });
        Jail::expect_with(|jail| {
            jail.create_file("vq.toml", "[gate]\nzzz = 1\n")?;
            let err = load_error();
            assert!(
                err.contains("unknown setting gate.zzz")
                    && err.contains("known settings here: gate.upstream, gate.timeout_ms"),
                "{err}"
            );
            Ok(())
        });
    }

    #[test]
    fn bad_values_say_what_is_allowed_without_library_artefacts() {
        Jail::expect_with(|jail| {
            jail.create_file("vq.toml", "")?;
            jail.set_env("VQ_STORE", "redsi");
            assert_eq!(
                load_error(),
                "store (VQ_STORE, from the environment) must be one of redis, memory, got `redsi`"
            );
            Ok(())
        });
        Jail::expect_with(|jail| {
            jail.create_file("vq.toml", "[queue]\nbatch_size = \"abc\"\n")?;
            let err = load_error();
            assert!(err.starts_with("queue.batch_size (VQ_QUEUE__BATCH_SIZE, in "), "{err}");
            assert!(err.ends_with("must be a whole number, 0 or more, got string \"abc\""), "{err}");
            assert!(!err.contains("default.") && !err.contains('`'), "{err}");
            Ok(())
        });
        Jail::expect_with(|jail| {
            jail.create_file("vq.toml", "")?;
            jail.set_env("VQ_QUEUE__BATCH_SIZE", "-3");
            assert_eq!(
                load_error(),
                "queue.batch_size (VQ_QUEUE__BATCH_SIZE, from the environment) must be a whole number, 0 or more, got signed int `-3`"
            );
            Ok(())
        });
    }
}
