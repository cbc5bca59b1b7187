//! Opening a record into memory that is not initialised yet: the message
//! body a frame is read into (`net/body.rs`), which is never zeroed, since
//! zeroing it would cost a pass over every byte received. aws-lc-rs opens
//! into `&mut [u8]` only, and a `&mut [u8]` over uninitialised bytes is
//! undefined behaviour in Rust, so this calls aws-lc's
//! `EVP_AEAD_CTX_open_gather` itself, with a raw pointer: aws-lc writes the
//! plaintext there and reads none of it. Sealing the same way
//! (`EVP_AEAD_CTX_seal_scatter`, out of place): from the caller's bytes
//! straight into the spare room of the outgoing buffer, one pass where a
//! copy and a seal in place make two.

use std::io;
use std::mem::MaybeUninit;

use aws_lc_sys::{EVP_AEAD, EVP_AEAD_CTX, EVP_AEAD_CTX_free, EVP_AEAD_CTX_new};

use rustls::AlertDescription;

use super::protection::{TAG, broken, refused};

/// Which AEAD a key opens.
#[derive(Clone, Copy)]
pub(crate) enum Aead {
    Aes128Gcm,
    Aes256Gcm,
    Chacha20Poly1305,
}

/// One direction's key as an aws-lc context of its own.
pub(crate) struct AeadKey {
    context: *mut EVP_AEAD_CTX,
}

// SAFETY: the context is owned here alone and used through `&self` one
// call at a time; aws-lc's AEAD contexts may move between threads.
unsafe impl Send for AeadKey {}

impl AeadKey {
    pub(crate) fn new(aead: Aead, key: &[u8]) -> io::Result<AeadKey> {
        // SAFETY: these return pointers to static algorithm tables.
        let algorithm: *const EVP_AEAD = unsafe {
            match aead {
                Aead::Aes128Gcm => aws_lc_sys::EVP_aead_aes_128_gcm(),
                Aead::Aes256Gcm => aws_lc_sys::EVP_aead_aes_256_gcm(),
                Aead::Chacha20Poly1305 => aws_lc_sys::EVP_aead_chacha20_poly1305(),
            }
        };
        // SAFETY: `key` is valid for `key.len()` bytes for the call; aws-lc
        // copies what it needs. A null result is an error.
        let context = unsafe { EVP_AEAD_CTX_new(algorithm, key.as_ptr(), key.len(), TAG) };
        if context.is_null() {
            return Err(broken("the negotiated key does not fit its cipher"));
        }
        Ok(AeadKey { context })
    }

    /// Opens `ciphertext` with `tag` into the first `ciphertext.len()`
    /// bytes of `out`, which it initialises: those bytes, or an error if
    /// the record fails its integrity check (`out` then holds nothing to
    /// read).
    pub(crate) fn open<'o>(
        &self,
        nonce: &[u8; 12],
        aad: &[u8],
        ciphertext: &[u8],
        tag: &[u8],
        out: &'o mut [MaybeUninit<u8>],
    ) -> io::Result<&'o mut [u8]> {
        let length = ciphertext.len();
        if out.len() < length || tag.len() != TAG {
            return Err(broken("a record larger than the room given to open it"));
        }
        // SAFETY: every pointer is valid for the length passed with it for
        // the call; `out` (ours, exclusively borrowed) does not overlap the
        // inputs; aws-lc writes `length` bytes of it and reads none.
        let opened = unsafe {
            aws_lc_sys::EVP_AEAD_CTX_open_gather(
                self.context,
                out.as_mut_ptr().cast::<u8>(),
                nonce.as_ptr(),
                nonce.len(),
                ciphertext.as_ptr(),
                length,
                tag.as_ptr(),
                tag.len(),
                aad.as_ptr(),
                aad.len(),
            )
        };
        if opened != 1 {
            return Err(refused(
                AlertDescription::BadRecordMac,
                "a record failed its integrity check (bad_record_mac)",
            ));
        }
        // SAFETY: aws-lc has written all `length` bytes.
        Ok(unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), length) })
    }
}

impl AeadKey {
    /// Seals `plaintext` and then `extra` (TLS 1.3's inner content type)
    /// into the first `plaintext.len() + extra.len() + TAG` bytes of
    /// `out`, which need not be initialised, in one pass that encrypts
    /// and copies: how many bytes it wrote.
    pub(crate) fn seal_into(
        &self,
        nonce: &[u8; 12],
        aad: &[u8],
        plaintext: &[u8],
        extra: &[u8],
        out: &mut [MaybeUninit<u8>],
    ) -> io::Result<usize> {
        let length = plaintext.len();
        let trailer = extra.len() + TAG;
        if out.len() < length + trailer {
            return Err(broken("a record larger than the room given to seal it"));
        }
        let mut written_trailer = 0;
        // SAFETY: every pointer is valid for the length passed with it for
        // the call; `out` (ours, exclusively borrowed) overlaps none of the
        // inputs; aws-lc writes the ciphertext of `plaintext` to its first
        // `length` bytes and that of `extra` with the tag after them, at
        // most `trailer` bytes, and reads none of it.
        let sealed = unsafe {
            let out = out.as_mut_ptr().cast::<u8>();
            aws_lc_sys::EVP_AEAD_CTX_seal_scatter(
                self.context,
                out,
                out.add(length),
                &mut written_trailer,
                trailer,
                nonce.as_ptr(),
                nonce.len(),
                plaintext.as_ptr(),
                length,
                extra.as_ptr(),
                extra.len(),
                aad.as_ptr(),
                aad.len(),
            )
        };
        if sealed != 1 || written_trailer != trailer {
            return Err(broken("a record could not be sealed"));
        }
        Ok(length + trailer)
    }
}

impl Drop for AeadKey {
    fn drop(&mut self) {
        // SAFETY: made by EVP_AEAD_CTX_new, freed once.
        unsafe { EVP_AEAD_CTX_free(self.context) }
    }
}
