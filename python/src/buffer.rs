//! Python's buffer protocol, for `write` (any object with bytes: `bytes`, `bytearray`, `memoryview`, NumPy
//! arrays) and `read_into` (a writable one), without a copy.
//!
//! The module is built for the stable ABI of Python 3.9+, whose limited API declares the buffer protocol only
//! from 3.11 on, although `PyObject_GetBuffer`, `PyBuffer_Release` and the `Py_buffer` layout are the same in
//! every CPython 3 (3.11 made them part of the stable ABI because they had not changed). They are declared
//! here, as CPython's headers define them.

use std::ffi::{c_char, c_int, c_void};

use pyo3::ffi;
use pyo3::prelude::*;

/// `Py_buffer`.
#[repr(C)]
struct RawBuffer {
    buf: *mut c_void,
    obj: *mut ffi::PyObject,
    len: ffi::Py_ssize_t,
    itemsize: ffi::Py_ssize_t,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut ffi::Py_ssize_t,
    strides: *mut ffi::Py_ssize_t,
    suboffsets: *mut ffi::Py_ssize_t,
    internal: *mut c_void,
}

/// `PyBUF_SIMPLE`: one contiguous block of bytes (exporters refuse when theirs is not contiguous).
const SIMPLE: c_int = 0;
/// `PyBUF_WRITABLE`.
const WRITABLE: c_int = 0x0001;

unsafe extern "C" {
    fn PyObject_GetBuffer(obj: *mut ffi::PyObject, view: *mut RawBuffer, flags: c_int) -> c_int;
    fn PyBuffer_Release(view: *mut RawBuffer);
}

/// An object's bytes, held (the object cannot resize or free them) until this is dropped.
pub struct Buffer {
    // Boxed: the exporter may keep a pointer to the `Py_buffer` it filled in until it is released.
    raw: Box<RawBuffer>,
}

impl Buffer {
    /// The bytes of `obj`, which must be one contiguous block (and writable when `writable`); otherwise the
    /// exporter's `BufferError` (or a `TypeError` for an object without bytes).
    pub fn get(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<Buffer> {
        let mut raw = Box::new(RawBuffer {
            buf: std::ptr::null_mut(),
            obj: std::ptr::null_mut(),
            len: 0,
            itemsize: 0,
            readonly: 0,
            ndim: 0,
            format: std::ptr::null_mut(),
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            suboffsets: std::ptr::null_mut(),
            internal: std::ptr::null_mut(),
        });
        let flags = if writable { SIMPLE | WRITABLE } else { SIMPLE };
        // SAFETY: `obj` is a live object (the GIL is held: `Bound`), `raw` a `Py_buffer` to fill in.
        if unsafe { PyObject_GetBuffer(obj.as_ptr(), &mut *raw, flags) } != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        Ok(Buffer { raw })
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        if self.raw.len == 0 {
            return &[];
        }
        // SAFETY: a successful simple request gives `len` contiguous bytes at `buf`, valid until the release.
        unsafe { std::slice::from_raw_parts(self.raw.buf as *const u8, self.raw.len as usize) }
    }

    /// The bytes, to write (a buffer asked for as writable).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        if self.raw.len == 0 {
            return &mut [];
        }
        debug_assert_eq!(self.raw.readonly, 0, "asked for as writable");
        // SAFETY: as in `as_slice`, and the exporter granted write access.
        unsafe { std::slice::from_raw_parts_mut(self.raw.buf as *mut u8, self.raw.len as usize) }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: the buffer was filled in by a successful `PyObject_GetBuffer` and is released once, holding
        // the GIL as the call requires.
        Python::attach(|_| unsafe { PyBuffer_Release(&mut *self.raw) });
    }
}
