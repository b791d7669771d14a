//! Reading a Python list of ints fast: hashing an 8k-token prompt is dominated by this.
//!
//! Through the limited API each item costs two calls (`PyList_GetItem`, then
//! `PyLong_AsUnsignedLongLong`), about twice the cost of touching the item at all. Where
//! the interpreter's object layouts are the ones this module knows, it reads the list's
//! item array and the value of one-digit ints (below 2^30: every token id) in place:
//!
//! * a list is `{refcnt, type, size, item array, …}` on every CPython this wheel loads
//!   on (3.10+, with the GIL; free-threaded builds do not load abi3 wheels);
//! * an int is `{refcnt, type, size or tag, digits…}` with 30-bit digits. A non-negative
//!   one-digit value has `size` 1 (3.10–3.11) or the tag `1 << 3` (3.12+); zero has
//!   `size` 0 or the tag 1.
//!
//! abi3 wheels install on CPython only, whose list head has had this shape throughout.
//! At first use [`layout`] reads probe objects both ways and keeps the in-place path
//! only if every item pointer and value agrees (a 15-bit-digit build, for one, fails
//! it); any other item (another type, a larger or negative int) goes through the API
//! call as before.

use std::sync::OnceLock;

use pyo3::exceptions::PyOverflowError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyList;

/// The head of a CPython list.
#[repr(C)]
struct RawList {
    ob_refcnt: ffi::Py_ssize_t,
    ob_type: *mut ffi::PyTypeObject,
    ob_size: ffi::Py_ssize_t,
    ob_item: *mut *mut ffi::PyObject,
}

/// The head of a CPython int and its first digit.
#[repr(C)]
struct RawInt {
    ob_refcnt: ffi::Py_ssize_t,
    ob_type: *mut ffi::PyTypeObject,
    size_or_tag: usize,
    digit0: u32,
}

/// The `size_or_tag` words of a non-negative one-digit int and of zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct IntTags {
    one_digit: usize,
    zero: usize,
}

/// The in-place layout, when the probes confirmed it.
fn layout(py: Python<'_>) -> Option<IntTags> {
    static LAYOUT: OnceLock<Option<IntTags>> = OnceLock::new();
    *LAYOUT.get_or_init(|| {
        let tags = if py.version_info() >= (3, 12) { IntTags { one_digit: 1 << 3, zero: 1 } } else { IntTags { one_digit: 1, zero: 0 } };
        probe(py, tags).unwrap_or(false).then_some(tags)
    })
}

/// Whether reading `[0, 1, 7, 2^30 − 1, 2^30, 2^40, −1, True]` in place gives what the API gives.
fn probe(py: Python<'_>, tags: IntTags) -> PyResult<bool> {
    let values: [i64; 7] = [0, 1, 7, (1 << 30) - 1, 1 << 30, 1 << 40, -1];
    let list = PyList::new(py, values)?;
    list.append(true)?;
    // SAFETY: `list` is a list we hold; its items are read while we hold the GIL.
    let items = unsafe { raw_items(&list) };
    if items.len() != list.len() {
        return Ok(false);
    }
    for (i, &item) in items.iter().enumerate() {
        // SAFETY: as above; `PyList_GetItem` returns a borrowed item for `i < len`.
        if item != unsafe { ffi::PyList_GetItem(list.as_ptr(), i as ffi::Py_ssize_t) } {
            return Ok(false);
        }
        let expected = values.get(i).copied().unwrap_or(1);
        // SAFETY: `item` is a live int of the list.
        let read = unsafe { in_place(item, tags) };
        let fits = (0..1 << 30).contains(&expected) && i < values.len();
        if read != fits.then_some(expected as u64) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The items of `list`, in place.
///
/// # Safety
/// Valid while the GIL is held and no Python code runs (which could resize the list);
/// only on a CPython whose list layout [`probe`] confirmed, or in it.
unsafe fn raw_items<'a>(list: &'a Bound<'_, PyList>) -> &'a [*mut ffi::PyObject] {
    let raw = list.as_ptr().cast::<RawList>();
    // SAFETY: per the function's contract, `raw` points at a list head of this layout
    // whose item array holds `ob_size` items.
    unsafe {
        let len = (*raw).ob_size.max(0) as usize;
        if len == 0 {
            return &[];
        }
        std::slice::from_raw_parts((*raw).ob_item, len)
    }
}

/// The value of `item` when it is an exact int in `[0, 2^30)`.
///
/// # Safety
/// `item` is a live object, and `tags` were confirmed by [`probe`] (or are being probed).
#[inline]
unsafe fn in_place(item: *mut ffi::PyObject, tags: IntTags) -> Option<u64> {
    let int = item.cast::<RawInt>();
    // SAFETY: every object starts with its refcount and type; the tag word and the first
    // digit are read only from exact ints, whose layout `tags` describes.
    unsafe {
        if (*int).ob_type != &raw mut ffi::PyLong_Type {
            return None;
        }
        match (*int).size_or_tag {
            t if t == tags.one_digit => Some(u64::from((*int).digit0)),
            t if t == tags.zero => Some(0),
            _ => None,
        }
    }
}

/// The ints of `list` as `T` (checked: a negative or too large value is an error).
pub fn list_ints<T: TryFrom<u64>>(list: &Bound<'_, PyList>) -> PyResult<Vec<T>> {
    let py = list.py();
    let mut out = Vec::with_capacity(list.len());
    let mut start = 0;
    if let Some(tags) = layout(py) {
        // SAFETY: the layout was confirmed, and no Python code runs while the slice is used.
        let items = unsafe { raw_items(list) };
        for (i, &item) in items.iter().enumerate() {
            // Ask for the item 8 ahead now: the loop waits on memory, not on arithmetic.
            #[cfg(target_arch = "x86_64")]
            if let Some(&ahead) = items.get(i + 8) {
                // SAFETY: a prefetch is a hint; it never faults.
                unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(ahead.cast()) };
            }
            // SAFETY: `item` is an item of the list.
            match unsafe { in_place(item, tags) }.map(T::try_from) {
                Some(Ok(v)) => out.push(v),
                _ => break,
            }
        }
        start = out.len();
    }
    // The rest (all of it without the in-place layout) through the API.
    for i in start..list.len() {
        // SAFETY: `i` is within the list's length, which cannot change while we hold the
        // GIL and run no Python code (the conversion runs none for ints and fails for
        // other objects); the item is borrowed.
        let v = unsafe { ffi::PyLong_AsUnsignedLongLong(ffi::PyList_GetItem(list.as_ptr(), i as ffi::Py_ssize_t)) };
        if v == u64::MAX {
            if let Some(err) = PyErr::take(py) {
                return Err(err);
            }
        }
        out.push(T::try_from(v).map_err(|_| PyOverflowError::new_err(format!("{v} is out of range")))?);
    }
    Ok(out)
}

/// Each item of `list` (borrowed), in order, to `f`, which must run no Python code.
pub fn for_each_item(list: &Bound<'_, PyList>, mut f: impl FnMut(*mut ffi::PyObject) -> PyResult<()>) -> PyResult<()> {
    if layout(list.py()).is_some() {
        // SAFETY: the layout was confirmed, and `f` runs no Python code.
        for &item in unsafe { raw_items(list) } {
            f(item)?;
        }
    } else {
        for i in 0..list.len() {
            // SAFETY: as in `list_ints`.
            f(unsafe { ffi::PyList_GetItem(list.as_ptr(), i as ffi::Py_ssize_t) })?;
        }
    }
    Ok(())
}
