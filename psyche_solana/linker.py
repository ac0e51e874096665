"""Our linker: one relocatable eBPF object (clang -target bpfel) -> an SBPFv0 shared object.

`ld.lld` cannot link Solana programs (it rejects R_BPF_64_32 against syscalls and
R_BPF_64_64 against local symbols), so we lay the image out ourselves:

    [ELF header][program headers][.text][.rodata][.dynamic][.dynsym][.dynstr][.rel.dyn]
    [.shstrtab][section headers]

with every section's virtual address equal to its file offset (what SBPFv0 expects).
Relocations of the object are resolved like this:

    R_BPF_64_64  (lddw)   target = section base + symbol value + implicit addend (imm);
                          written into the two immediates, and a dynamic
                          R_BPF_64_RELATIVE (8) is emitted so the loader adds the
                          program's base address (0x1_0000_0000) at load time.
    R_BPF_64_32  (call)   defined function: imm = target_pc - (pc + 1) (pc-relative, which
                          the SBPFv0 loader turns into a registered function);
                          undefined symbol (a syscall such as sol_log_): imm stays -1 and a
                          dynamic R_BPF_64_32 against a .dynsym entry of that name is
                          emitted; the loader resolves it by murmur3(name).
    R_BPF_64_ABS64 (data) a pointer in .rodata: SBPFv0 reads a u32 at offset + 4 and
                          relocates it as RELATIVE, so we store the address there.

Writable sections (.data, .bss) are refused: SBPFv0 programs have no mutable globals.
Standard library only; `link(object_bytes) -> so_bytes`.
"""

from __future__ import annotations

import struct
import sys
from dataclasses import dataclass
from pathlib import Path

EM_BPF = 247
ET_DYN = 3
SHT_PROGBITS, SHT_SYMTAB, SHT_STRTAB, SHT_DYNAMIC, SHT_REL, SHT_NOBITS, SHT_DYNSYM = (
    1, 2, 3, 6, 9, 8, 11)
SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR = 1, 2, 4
PT_LOAD, PT_DYNAMIC = 1, 2
PF_X, PF_W, PF_R = 1, 2, 4
DT_NULL, DT_STRTAB, DT_SYMTAB, DT_STRSZ, DT_SYMENT, DT_REL, DT_RELSZ, DT_RELENT = (
    0, 5, 6, 10, 11, 17, 18, 19)
DT_TEXTREL, DT_FLAGS, DF_TEXTREL = 22, 30, 4
R_BPF_64_64, R_BPF_64_ABS64, R_BPF_64_RELATIVE, R_BPF_64_32 = 1, 2, 8, 10
STB_GLOBAL, STT_FUNC, STT_NOTYPE = 1, 2, 0
SHN_UNDEF = 0

EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
PHDR = struct.Struct("<IIQQQQQQ")
SHDR = struct.Struct("<IIQQQQIIQQ")
SYM = struct.Struct("<IBBHQQ")
REL = struct.Struct("<QQ")


class LinkError(ValueError):
    """The object cannot become an SBPFv0 program; the message names the reason."""


@dataclass
class _Section:
    index: int
    name: str
    type: int
    flags: int
    offset: int
    size: int
    link: int
    info: int
    align: int
    entsize: int


@dataclass
class _Symbol:
    name: str
    value: int
    info: int
    shndx: int


def _cstr(table: bytes, offset: int) -> str:
    end = table.index(b"\0", offset)
    return table[offset:end].decode()


def _align(value: int, to: int) -> int:
    return (value + to - 1) // to * to


class _Object:
    def __init__(self, data: bytes):
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            raise LinkError("not a 64-bit little-endian ELF object")
        header = EHDR.unpack_from(data, 0)
        e_type, machine, shoff, shentsize, shnum, shstrndx = (
            header[1], header[2], header[6], header[11], header[12], header[13])
        if e_type != 1 or machine != EM_BPF:
            raise LinkError("expected a relocatable eBPF object (clang -target bpfel -c)")
        raw = [SHDR.unpack_from(data, shoff + i * shentsize) for i in range(shnum)]
        names = data[raw[shstrndx][4]:raw[shstrndx][4] + raw[shstrndx][5]]
        self.data = data
        self.sections = [
            _Section(i, _cstr(names, r[0]), r[1], r[2], r[4], r[5], r[6], r[7], r[8], r[9])
            for i, r in enumerate(raw)]
        symtab = next((s for s in self.sections if s.type == SHT_SYMTAB), None)
        if symtab is None:
            raise LinkError("the object has no symbol table")
        strtab = self.sections[symtab.link]
        strings = data[strtab.offset:strtab.offset + strtab.size]
        self.symbols = []
        for i in range(symtab.size // SYM.size):
            name, info, _other, shndx, value, _size = SYM.unpack_from(
                data, symtab.offset + i * SYM.size)
            self.symbols.append(_Symbol(_cstr(strings, name), value, info, shndx))

    def body(self, section: _Section) -> bytes:
        return self.data[section.offset:section.offset + section.size]


def link(object_bytes: bytes, entrypoint: str = "entrypoint") -> bytes:
    obj = _Object(object_bytes)
    for s in obj.sections:
        if s.flags & SHF_ALLOC and (s.flags & SHF_WRITE or s.type == SHT_NOBITS) and s.size:
            raise LinkError(f"writable section {s.name} (mutable globals are not allowed "
                            "in SBPFv0 programs; keep state in accounts or on the stack)")
    texts = [s for s in obj.sections if s.flags & SHF_ALLOC and s.flags & SHF_EXECINSTR]
    rodatas = [s for s in obj.sections if s.flags & SHF_ALLOC and not s.flags & SHF_EXECINSTR
               and s.type == SHT_PROGBITS and s.size]
    if not texts:
        raise LinkError("the object has no code")

    # --- layout: headers, then .text, then .rodata (vaddr == file offset)
    num_phdrs = 2
    cursor = EHDR.size + num_phdrs * PHDR.size
    base: dict[int, int] = {}
    text = bytearray()
    text_start = _align(cursor, 8)
    for s in texts:
        text += bytes(_align(len(text), max(s.align, 8)) - len(text))
        base[s.index] = text_start + len(text)
        text += obj.body(s)
    rodata = bytearray()
    rodata_start = _align(text_start + len(text), 8)
    for s in rodatas:
        rodata += bytes(_align(len(rodata), max(s.align, 1)) - len(rodata))
        base[s.index] = rodata_start + len(rodata)
        rodata += obj.body(s)
    image = {**{s.index: text for s in texts}, **{s.index: rodata for s in rodatas}}
    image_start = {**{s.index: text_start for s in texts},
                   **{s.index: rodata_start for s in rodatas}}

    dynsym_names: list[str] = []
    dyn_relocs: list[tuple[int, int, int]] = []  # (address, type, dynsym index)

    def dynsym_index(name: str) -> int:
        if name not in dynsym_names:
            dynsym_names.append(name)
        return dynsym_names.index(name) + 1  # entry 0 is the null symbol

    for rel in obj.sections:
        if rel.type != SHT_REL or rel.info not in base:
            continue
        target = obj.sections[rel.info]
        buf, start = image[rel.info], image_start[rel.info]
        for i in range(rel.size // REL.size):
            r_offset, r_info = REL.unpack_from(obj.data, rel.offset + i * REL.size)
            kind, sym = r_info & 0xFFFFFFFF, obj.symbols[r_info >> 32]
            at = base[rel.info] - start + r_offset  # offset inside buf
            address = base[rel.info] + r_offset
            if kind == R_BPF_64_64:
                if sym.shndx not in base:
                    raise LinkError(f"lddw of {sym.name or 'a symbol'} outside .text/.rodata")
                (addend,) = struct.unpack_from("<i", buf, at + 4)
                value = base[sym.shndx] + sym.value + addend
                struct.pack_into("<I", buf, at + 4, value & 0xFFFFFFFF)
                struct.pack_into("<I", buf, at + 12, value >> 32)
                dyn_relocs.append((address, R_BPF_64_RELATIVE, 0))
            elif kind == R_BPF_64_32:
                if sym.shndx == SHN_UNDEF:
                    struct.pack_into("<i", buf, at + 4, -1)
                    dyn_relocs.append((address, R_BPF_64_32, dynsym_index(sym.name)))
                else:
                    (imm,) = struct.unpack_from("<i", buf, at + 4)
                    destination = base[sym.shndx] + sym.value + (imm + 1) * 8
                    struct.pack_into("<i", buf, at + 4, (destination - address) // 8 - 1)
            elif kind == R_BPF_64_ABS64:
                if sym.shndx not in base or target.flags & SHF_EXECINSTR:
                    raise LinkError(f"unsupported data pointer to {sym.name!r}")
                (addend,) = struct.unpack_from("<q", buf, at)
                value = base[sym.shndx] + sym.value + addend
                struct.pack_into("<II", buf, at, 0, value)
                dyn_relocs.append((address, R_BPF_64_RELATIVE, 0))
            else:
                raise LinkError(f"relocation type {kind} against {sym.name!r} is not supported")

    entry = next((s for s in obj.symbols if s.name == entrypoint and s.shndx in base), None)
    if entry is None:
        raise LinkError(f"no function named {entrypoint!r}")
    entry_address = base[entry.shndx] + entry.value

    # --- dynamic tables
    dynstr = bytearray(b"\0")
    dynsym = bytearray(SYM.size)
    for name in dynsym_names:
        dynsym += SYM.pack(len(dynstr), (STB_GLOBAL << 4) | STT_NOTYPE, 0, SHN_UNDEF, 0, 0)
        dynstr += name.encode() + b"\0"
    reldyn = b"".join(REL.pack(addr, (sym << 32) | kind) for addr, kind, sym in dyn_relocs)
    dynamic_start = _align(rodata_start + len(rodata), 8)
    dynamic_size = 11 * 16
    dynsym_start = dynamic_start + dynamic_size
    dynstr_start = dynsym_start + len(dynsym)
    reldyn_start = _align(dynstr_start + len(dynstr), 8)
    dynamic = b"".join(struct.pack("<QQ", tag, value) for tag, value in [
        (DT_FLAGS, DF_TEXTREL), (DT_REL, reldyn_start), (DT_RELSZ, len(reldyn)),
        (DT_RELENT, REL.size), (DT_SYMTAB, dynsym_start), (DT_SYMENT, SYM.size),
        (DT_STRTAB, dynstr_start), (DT_STRSZ, len(dynstr)), (DT_TEXTREL, 0),
        (DT_NULL, 0), (DT_NULL, 0)])
    shstrtab = bytearray(b"\0")

    def shname(name: str) -> int:
        offset = len(shstrtab)
        shstrtab.extend(name.encode() + b"\0")
        return offset

    shstrtab_start = reldyn_start + len(reldyn)
    sections = [SHDR.pack(0, 0, 0, 0, 0, 0, 0, 0, 0, 0)]
    sections.append(SHDR.pack(shname(".text"), SHT_PROGBITS, SHF_ALLOC | SHF_EXECINSTR,
                              text_start, text_start, len(text), 0, 0, 8, 0))
    if rodata:
        sections.append(SHDR.pack(shname(".rodata"), SHT_PROGBITS, SHF_ALLOC,
                                  rodata_start, rodata_start, len(rodata), 0, 0, 8, 0))
    dynsym_index_in_headers = len(sections) + 1
    sections.append(SHDR.pack(shname(".dynamic"), SHT_DYNAMIC, SHF_ALLOC | SHF_WRITE,
                              dynamic_start, dynamic_start, dynamic_size,
                              dynsym_index_in_headers + 1, 0, 8, 16))
    sections.append(SHDR.pack(shname(".dynsym"), SHT_DYNSYM, SHF_ALLOC, dynsym_start,
                              dynsym_start, len(dynsym), dynsym_index_in_headers + 1, 1, 8,
                              SYM.size))
    sections.append(SHDR.pack(shname(".dynstr"), SHT_STRTAB, SHF_ALLOC, dynstr_start,
                              dynstr_start, len(dynstr), 0, 0, 1, 0))
    sections.append(SHDR.pack(shname(".rel.dyn"), SHT_REL, SHF_ALLOC, reldyn_start,
                              reldyn_start, len(reldyn), dynsym_index_in_headers, 0, 8,
                              REL.size))
    shstrndx = len(sections)
    sections.append(SHDR.pack(shname(".shstrtab"), SHT_STRTAB, 0, 0, shstrtab_start,
                              len(shstrtab) + len(".shstrtab") + 1, 0, 0, 1, 0))
    shstrtab.extend(b".shstrtab\0")
    # the .shstrtab name was registered before its own bytes were appended: fix the size
    sections[-1] = SHDR.pack(len(shstrtab) - len(".shstrtab") - 1, SHT_STRTAB, 0, 0,
                             shstrtab_start, len(shstrtab), 0, 0, 1, 0)
    shoff = _align(shstrtab_start + len(shstrtab), 8)

    load_end = reldyn_start + len(reldyn)
    phdrs = PHDR.pack(PT_LOAD, PF_R | PF_X, text_start, text_start, text_start,
                      load_end - text_start, load_end - text_start, 8)
    phdrs += PHDR.pack(PT_DYNAMIC, PF_R | PF_W, dynamic_start, dynamic_start, dynamic_start,
                       dynamic_size, dynamic_size, 8)
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)
    header = EHDR.pack(ident, ET_DYN, EM_BPF, 1, entry_address, EHDR.size, shoff, 0,
                       EHDR.size, PHDR.size, num_phdrs, SHDR.size, len(sections), shstrndx)

    out = bytearray(header + phdrs)
    for start, blob in [(text_start, text), (rodata_start, rodata), (dynamic_start, dynamic),
                        (dynsym_start, dynsym), (dynstr_start, dynstr), (reldyn_start, reldyn),
                        (shstrtab_start, shstrtab)]:
        out += bytes(start - len(out))
        out += bytes(blob)
    out += bytes(shoff - len(out))
    out += b"".join(sections)
    return bytes(out)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m psyche_solana.linker INPUT.o OUTPUT.so", file=sys.stderr)
        return 2
    try:
        so = link(Path(args[0]).read_bytes())
    except (LinkError, OSError) as exc:
        print(f"link {args[0]}: {exc}", file=sys.stderr)
        return 1
    Path(args[1]).write_bytes(so)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
