//! The embedded server's receipt key: a file beside its database, created
//! on first start (mode 0600) and never sent anywhere; a key moved aside to
//! `<file>.previous` stays in the JWKS, so receipts signed before a
//! rotation still verify.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};

use agent_runs_ports::receipts::{PublicKey, PublishedKeys, SignError, Signer};

/// A key held in this process: read from a file, or made for this
/// process alone (tests).
pub struct LocalKey {
    pair: EcdsaKeyPair,
    key: PublicKey,
    /// The key of `<file>.previous`, still shown in the JWKS.
    previous: Option<PublicKey>,
}

fn pair(pkcs8: &[u8]) -> Result<(EcdsaKeyPair, PublicKey), SignError> {
    let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8, &SystemRandom::new())
        .map_err(|_| SignError("the signing key is not a P-256 key in PKCS#8".into()))?;
    let key = PublicKey::from_point(pair.public_key().as_ref())
        .ok_or_else(|| SignError("the signing key's public point is malformed".into()))?;
    Ok((pair, key))
}

fn generate() -> Result<Vec<u8>, SignError> {
    EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &SystemRandom::new())
        .map(|document| document.as_ref().to_vec())
        .map_err(|_| SignError("no signing key could be generated".into()))
}

impl LocalKey {
    /// A key for this process alone.
    pub fn ephemeral() -> Result<Self, SignError> {
        let (pair, key) = pair(&generate()?)?;
        Ok(LocalKey { pair, key, previous: None })
    }

    /// The key in `path` (PKCS#8, DER), made there with mode 0600 when the
    /// file does not exist. A key made where one was made before (its id
    /// is kept in `<path>.kid`) is said loudly: receipts the lost key
    /// signed no longer verify; one made for a store `used_before` (a
    /// database copied without its key, or from before receipts) is said
    /// too. A key file others may read is made private
    /// (or refused when it cannot be); a `.previous` that is no key is left
    /// out of the JWKS, and said.
    pub fn open_or_create(path: &Path, used_before: bool) -> Result<Self, SignError> {
        let failed = |what: &str, error: std::io::Error| SignError(format!("{what} {}: {error}", path.display()));
        let made = made_path(path);
        let pkcs8 = match std::fs::read(path) {
            Ok(pkcs8) => pkcs8,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                let lost = lost_key(path);
                let pkcs8 = generate()?;
                write_new(path, &pkcs8).or_else(|error| match error.kind() {
                    // Another process made it first: use theirs.
                    std::io::ErrorKind::AlreadyExists => Ok(()),
                    _ => Err(failed("cannot create the signing key", error)),
                })?;
                match lost {
                    Some(lost) => tracing::error!(
                        path = %path.display(),
                        lost_kid = %lost,
                        "the receipt signing key was missing, so a new one was made: receipts signed with the lost key no longer verify; put it back as this file's `.previous` to keep them verifiable"
                    ),
                    None if used_before && !made.exists() => tracing::warn!(
                        path = %path.display(),
                        "a receipt signing key was made for a database used before: receipts signed with an earlier key, if any, no longer verify (put it back as this file's `.previous`)"
                    ),
                    None => {}
                }
                std::fs::read(path).map_err(|error| failed("cannot read the signing key", error))?
            }
            Err(error) => return Err(failed("cannot read the signing key", error)),
        };
        make_private(path)?;
        let (pair, key) = pair(&pkcs8).map_err(|SignError(why)| {
            SignError(format!("{why} ({}: move it aside to make a new key)", path.display()))
        })?;
        if std::fs::read_to_string(&made).ok().as_deref().map(str::trim) != Some(key.kid.as_str())
            && let Err(error) = std::fs::write(&made, &key.kid)
        {
            // Only a note: a lost key then goes unremarked.
            tracing::warn!(path = %made.display(), %error, "cannot note the receipt signing key's id");
        }
        let previous_path = previous_path(path);
        let previous = match std::fs::read(&previous_path) {
            Ok(old) => match self::pair(&old) {
                Ok((_, old)) => {
                    make_private(&previous_path)?;
                    Some(old)
                }
                Err(SignError(why)) => {
                    tracing::error!(path = %previous_path.display(), "{why}: the previous receipt key is left out of the JWKS, so receipts it signed no longer verify");
                    None
                }
            },
            Err(_) => None,
        };
        Ok(LocalKey { pair, key, previous })
    }
}

/// The id of the key last in use at `path`, when that file is gone and the
/// key was not moved aside as `.previous` (a rotation): a lost key.
fn lost_key(path: &Path) -> Option<String> {
    if path.exists() {
        return None;
    }
    let noted = std::fs::read_to_string(made_path(path)).ok()?.trim().to_owned();
    let previous = std::fs::read(previous_path(path)).ok().and_then(|old| pair(&old).ok());
    match previous {
        Some((_, previous)) if previous.kid == noted => None,
        _ => Some(noted),
    }
}

/// Where the id of the key last in use is noted (`agent-runs.signing-key.kid`).
fn made_path(path: &Path) -> PathBuf {
    beside(path, ".kid")
}

/// Where a rotated key is kept (`agent-runs.signing-key.previous`).
pub fn previous_path(path: &Path) -> PathBuf {
    beside(path, ".previous")
}

/// `path` with `suffix` after its whole name.
fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Writes a new file readable by its owner alone, whole or not at all: it
/// is written aside, then linked into place (which fails when another
/// process put its own there first).
fn write_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let aside = beside(path, &format!(".{}.tmp", std::process::id()));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let written = options.open(&aside).and_then(|mut file| {
        file.write_all(bytes)?;
        file.sync_all()
    });
    let linked = written.and_then(|()| std::fs::hard_link(&aside, path));
    let _ = std::fs::remove_file(&aside);
    linked
}

/// A key file others may read (a backup restored loosely) made readable by
/// its owner alone, and said; refused when that cannot be done.
fn make_private(path: &Path) -> Result<(), SignError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let metadata = std::fs::metadata(path)
            .map_err(|error| SignError(format!("cannot read the signing key {}: {error}", path.display())))?;
        if metadata.permissions().mode() & 0o077 != 0 {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|error| {
                SignError(format!(
                    "the signing key {} may be read by others and cannot be made private ({error}): make it mode 0600",
                    path.display()
                ))
            })?;
            tracing::warn!(path = %path.display(), "the receipt signing key could be read by others; it is mode 0600 now");
        }
    }
    Ok(())
}

#[async_trait]
impl Signer for LocalKey {
    async fn public_key(&self) -> Result<PublicKey, SignError> {
        Ok(self.key.clone())
    }

    async fn sign(&self, message: &[u8]) -> Result<Vec<u8>, SignError> {
        self.pair
            .sign(&SystemRandom::new(), message)
            .map(|signature| signature.as_ref().to_vec())
            .map_err(|_| SignError("the receipt could not be signed".into()))
    }
}

#[async_trait]
impl PublishedKeys for LocalKey {
    async fn keys(&self) -> Result<Vec<PublicKey>, SignError> {
        Ok(std::iter::once(self.key.clone()).chain(self.previous.clone()).collect())
    }
}

#[cfg(test)]
mod tests {
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use ring::signature::{ECDSA_P256_SHA256_FIXED, UnparsedPublicKey};

    use super::*;

    #[tokio::test]
    async fn a_key_file_is_made_private_reused_and_its_predecessor_stays_published() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs.signing-key");
        let first = LocalKey::open_or_create(&path, true).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        let again = LocalKey::open_or_create(&path, true).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "a key others could read is made private");
        }
        assert_eq!(first.key, again.key, "reused across restarts");
        assert_eq!(again.keys().await.unwrap().len(), 1);
        assert_eq!(std::fs::read_to_string(made_path(&path)).unwrap(), first.key.kid, "its id is noted");
        std::fs::rename(&path, previous_path(&path)).unwrap();
        assert_eq!(lost_key(&path), None, "moved aside: a rotation, not a loss");
        let rotated = LocalKey::open_or_create(&path, true).unwrap();
        let keys = rotated.keys().await.unwrap();
        assert_eq!(std::fs::read_to_string(made_path(&path)).unwrap(), rotated.key.kid);
        std::fs::copy(&path, dir.path().join("kept")).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(lost_key(&path), Some(rotated.key.kid.clone()), "deleted: a lost key, said with its id");
        std::fs::copy(dir.path().join("kept"), &path).unwrap();
        assert_eq!(keys.len(), 2);
        assert_ne!(keys[0].kid, first.key.kid);
        assert_eq!(keys[1], first.key);
        // A previous key that is no key is left out, not a reason to stop.
        std::fs::write(previous_path(&path), b"not a key").unwrap();
        let without = LocalKey::open_or_create(&path, true).unwrap();
        assert_eq!(without.keys().await.unwrap(), vec![rotated.key.clone()]);
        std::fs::write(&path, b"not a key").unwrap();
        let Err(SignError(error)) = LocalKey::open_or_create(&path, true) else { panic!("a file that is no key") };
        assert!(error.contains(&path.display().to_string()), "{error}");
    }

    #[tokio::test]
    async fn a_signature_verifies_with_the_published_point() {
        let key = LocalKey::ephemeral().unwrap();
        let signature = key.sign(b"header.payload").await.unwrap();
        assert_eq!(signature.len(), 64);
        let jwk = key.key.jwk();
        let coordinate = |name: &str| URL_SAFE_NO_PAD.decode(jwk[name].as_str().unwrap()).unwrap();
        let point = [vec![4], coordinate("x"), coordinate("y")].concat();
        UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, &point).verify(b"header.payload", &signature).unwrap();
        assert_eq!(jwk["kid"].as_str().unwrap().len(), 43, "a SHA-256 thumbprint, base64url");
    }
}
