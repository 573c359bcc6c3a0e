//! ELF (little-endian ELF64 only: x86_64 modules and binaries).

/// `len` bytes at `at`, little-endian.
fn le(data: &[u8], at: usize, len: usize) -> Option<usize> {
    let bytes = data.get(at..at.checked_add(len)?)?;
    let v = bytes
        .iter()
        .rev()
        .fold(0u64, |v, &b| (v << 8) | u64::from(b));
    usize::try_from(v).ok()
}

fn is_elf64_le(data: &[u8]) -> bool {
    data.starts_with(b"\x7fELF") && data.get(4) == Some(&2) && data.get(5) == Some(&1)
}

/// The contents of the section called `wanted`.
pub(super) fn elf_section<'a>(data: &'a [u8], wanted: &str) -> Option<&'a [u8]> {
    if !is_elf64_le(data) {
        return None;
    }
    let (shoff, shentsize, shnum, shstrndx) = (
        le(data, 0x28, 8)?,
        le(data, 0x3a, 2)?,
        le(data, 0x3c, 2)?,
        le(data, 0x3e, 2)?,
    );
    let header = |i: usize| -> Option<(usize, &'a [u8])> {
        let h = shoff.checked_add(i.checked_mul(shentsize)?)?;
        let (name, offset, size) = (
            le(data, h, 4)?,
            le(data, h + 0x18, 8)?,
            le(data, h + 0x20, 8)?,
        );
        Some((name, data.get(offset..offset.checked_add(size)?)?))
    };
    let (_, names) = header(shstrndx)?;
    (0..shnum).find_map(|i| {
        let (name, contents) = header(i)?;
        let name = names.get(name..)?;
        let name = &name[..name.iter().position(|&b| b == 0)?];
        (name == wanted.as_bytes()).then_some(contents)
    })
}

/// Whether an ELF executable is statically linked (has no `PT_INTERP` program header).
pub(super) fn elf_is_static(data: &[u8]) -> Option<bool> {
    const PT_INTERP: usize = 3;
    if !is_elf64_le(data) {
        return None;
    }
    let (phoff, phentsize, phnum) = (le(data, 0x20, 8)?, le(data, 0x36, 2)?, le(data, 0x38, 2)?);
    for i in 0..phnum {
        if le(data, phoff.checked_add(i.checked_mul(phentsize)?)?, 4)? == PT_INTERP {
            return Some(false);
        }
    }
    Some(true)
}
