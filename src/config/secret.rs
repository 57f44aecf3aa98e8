//! The token secret, read from the environment only (never part of the settings tree).

use std::path::Path;

use crate::token::{Secret, SecretError};

/// Reads the signing secret from `VQ_TOKEN_SECRET`, or the file named by
/// `VQ_TOKEN_SECRET_FILE` (trailing newline dropped), and the secret being retired from
/// `VQ_TOKEN_SECRET_PREVIOUS` / `VQ_TOKEN_SECRET_PREVIOUS_FILE` when set. Both must pass
/// [`Secret::from_source`]. An error names the variable or file, never the value.
pub fn secret_from_env() -> Result<Secret, SecretError> {
    let current = secret_source("VQ_TOKEN_SECRET", "VQ_TOKEN_SECRET_FILE")?.ok_or(SecretError::Missing)?;
    match secret_source("VQ_TOKEN_SECRET_PREVIOUS", "VQ_TOKEN_SECRET_PREVIOUS_FILE")? {
        Some(previous) => current.with_previous(previous),
        None => Ok(current),
    }
}

/// The secret in `var`, else in the file named by `file_var`; `None` when neither is set.
fn secret_source(var: &'static str, file_var: &'static str) -> Result<Option<Secret>, SecretError> {
    if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
        let bytes = v.into_string().map_err(|_| SecretError::NotUtf8 { origin: var.into() })?.into_bytes();
        return Secret::from_source(bytes, var).map(Some);
    }
    let Some(path) = std::env::var_os(file_var).filter(|p| !p.is_empty()) else {
        return Ok(None);
    };
    let path = Path::new(&path);
    let shown = path.display().to_string();
    let mut bytes = std::fs::read(path).map_err(|e| SecretError::Unreadable {
        var: file_var,
        path: shown.clone(),
        error: e.to_string(),
    })?;
    while bytes.last().is_some_and(|c| *c == b'\n' || *c == b'\r') {
        bytes.pop();
    }
    Secret::from_source(bytes, &format!("the file {shown} ({file_var})")).map(Some)
}

#[cfg(test)]
#[allow(clippy::result_large_err)] // figment::Jail's closures return figment::Error
mod tests {
    use figment::Jail;

    use super::*;
    use crate::config::{Overrides, Settings};

    #[test]
    fn secret_must_be_long_enough_and_is_never_echoed() {
        Jail::expect_with(|jail| {
            jail.set_env("VQ_TOKEN_SECRET", "hunter2");
            let err = secret_from_env().unwrap_err();
            assert!(!err.to_string().contains("hunter2"));
            assert!(err.to_string().contains("32 bytes"));
            jail.set_env("VQ_TOKEN_SECRET", "x".repeat(32));
            assert!(secret_from_env().unwrap_err().to_string().contains("distinct"));
            jail.set_env("VQ_TOKEN_SECRET", " ".repeat(33));
            assert!(secret_from_env().unwrap_err().to_string().contains("only whitespace"));
            jail.set_env("VQ_TOKEN_SECRET", "0123456789abcdef0123456789abcdef");
            assert!(secret_from_env().is_ok());
            Ok(())
        });
    }

    #[test]
    fn secret_file_errors_name_the_file_and_the_read_error() {
        Jail::expect_with(|jail| {
            jail.set_env("VQ_TOKEN_SECRET_FILE", "/nonexistent/vq-secret");
            let err = secret_from_env().unwrap_err().to_string();
            assert!(
                err.contains("VQ_TOKEN_SECRET_FILE=/nonexistent/vq-secret") && err.contains("No such file"),
                "{err}"
            );
            jail.create_file("short", "hunter2\n")?;
            jail.set_env("VQ_TOKEN_SECRET_FILE", "short");
            let err = secret_from_env().unwrap_err().to_string();
            assert!(
                err.contains("the file short (VQ_TOKEN_SECRET_FILE) is 7 bytes") && !err.contains("hunter2"),
                "{err}"
            );
            jail.create_file("good", "0123456789abcdef0123456789abcdef\n")?;
            jail.set_env("VQ_TOKEN_SECRET_FILE", "good");
            assert!(secret_from_env().is_ok());
            Ok(())
        });
    }

    #[test]
    fn previous_secret_is_checked_like_the_current_one() {
        Jail::expect_with(|jail| {
            jail.set_env("VQ_TOKEN_SECRET", "0123456789abcdef0123456789abcdef");
            jail.set_env("VQ_TOKEN_SECRET_PREVIOUS", " ".repeat(40));
            let err = secret_from_env().unwrap_err().to_string();
            assert!(err.contains("VQ_TOKEN_SECRET_PREVIOUS is only whitespace"), "{err}");
            jail.set_env("VQ_TOKEN_SECRET_PREVIOUS", "0123456789abcdef0123456789abcdef");
            assert_eq!(secret_from_env().unwrap_err(), SecretError::PreviousIsCurrent);
            jail.set_env("VQ_TOKEN_SECRET_PREVIOUS", "");
            jail.set_env("VQ_TOKEN_SECRET_PREVIOUS_FILE", "/nonexistent/old");
            let err = secret_from_env().unwrap_err().to_string();
            assert!(err.contains("VQ_TOKEN_SECRET_PREVIOUS_FILE=/nonexistent/old"), "{err}");
            jail.create_file("old", "an-old-secret-that-was-random-enough\n")?;
            jail.set_env("VQ_TOKEN_SECRET_PREVIOUS_FILE", "old");
            assert!(secret_from_env().unwrap().has_previous());
            // Not mistaken for configuration keys.
            assert!(Settings::load(None, &Overrides::default()).is_ok());
            Ok(())
        });
    }
}
