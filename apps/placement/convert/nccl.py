"""NCCL topology XML (`NCCL_TOPO_DUMP_FILE` / `NCCL_TOPO_FILE`): `<system><cpu><pci>...<gpu>
<nvlink/></gpu>...<nic><net/></nic>`; GPUs and NICs found by their PCI class when the dump omits
the `<gpu>` and `<nic>` elements (cloud VM files). One file per node."""

from __future__ import annotations

from dataclasses import dataclass, field
from xml.parsers import expat

from .base import Defaults, Imported, Source, at, check_size, fail
from .hardware import gpu_kind, nic_kind
from .node import NodeHW, node_name, nodes_to_spec

MAX_ELEMENTS = 100_000
MAX_DEPTH = 64


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    line: int
    parent: Element | None = None
    children: list[Element] = field(default_factory=list)

    def chain(self) -> list[Element]:
        """This element and its ancestors, nearest first."""
        out, e = [], self
        while e is not None:
            out.append(e)
            e = e.parent
        return out


def parse_xml(source: Source) -> Element:
    """The element tree with line numbers; DTDs and entities are refused (no expansion attacks)."""
    check_size(source)
    root = Element("#document", {}, 0)
    stack = [root]
    count = [0]
    parser = expat.ParserCreate()

    def start(tag, attrs):
        count[0] += 1
        if count[0] > MAX_ELEMENTS or len(stack) > MAX_DEPTH:
            raise fail(at(source, parser.CurrentLineNumber), "the XML is too large or too deeply nested")
        e = Element(tag, dict(attrs), parser.CurrentLineNumber, stack[-1])
        stack[-1].children.append(e)
        stack.append(e)

    def end(tag):
        stack.pop()

    def doctype(*args):
        raise fail(at(source, parser.CurrentLineNumber), "DOCTYPE and entity declarations are not accepted")

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.StartDoctypeDeclHandler = doctype
    parser.EntityDeclHandler = doctype
    try:
        parser.Parse(source.text, True)
    except expat.ExpatError as exc:
        raise fail(at(source, exc.lineno), f"not valid XML: {expat.errors.messages[exc.code]}") from None
    systems = [c for c in root.children if c.tag == "system"]
    if len(systems) != 1:
        raise fail(source.name, "an NCCL topology has one <system> element")
    return systems[0]


def _walk(e: Element):
    yield e
    for c in e.children:
        yield from _walk(c)


def _is_gpu_pci(e: Element) -> bool:
    return e.tag == "pci" and e.attrs.get("class", "").lower().startswith(("0x0302", "0x0300"))


def _is_nic_pci(e: Element) -> bool:
    return e.tag == "pci" and e.attrs.get("class", "").lower().startswith(("0x0207", "0x0200"))


def _pcie_class(a: Element, b: Element) -> str:
    """nvidia-smi's PCIe class between two devices from their places in the tree."""
    ca, cb = a.chain(), b.chain()
    common = next(x for x in ca if x in cb)
    if common.tag == "system":
        return "SYS"
    if common.tag == "cpu":
        return "PHB"
    hops = ca.index(common) + cb.index(common)
    return "PIX" if hops <= 2 else "PXB"


def parse_nccl(source: Source, defaults: Defaults) -> NodeHW:
    """One node from an NCCL topology XML."""
    system = parse_xml(source)
    gpus: list[tuple[Element, Element | None]] = []
    nics: list[tuple[str, Element, float | None, object]] = []
    saw_nvlink = False
    for e in _walk(system):
        saw_nvlink = saw_nvlink or e.tag == "nvlink"
        if _is_gpu_pci(e):
            gpus.append((e, next((c for c in e.children if c.tag == "gpu"), None)))
        elif e.tag == "nic" or (_is_nic_pci(e) and not any(c.tag == "nic" for c in e.children)):
            nets = [c for c in e.children if c.tag == "net"] if e.tag == "nic" else []
            pci = e.parent if e.tag == "nic" and e.parent is not None and e.parent.tag == "pci" else e
            vendor, device = pci.attrs.get("vendor", ""), pci.attrs.get("device", "")
            kind, rated = nic_kind(vendor, device)
            for net in nets or [None]:
                name = net.attrs.get("name") if net is not None else None
                speed = net.attrs.get("speed") if net is not None else None
                bw = rated
                if speed is not None:
                    try:
                        bw = float(speed) / 8000.0  # Mb/s to GB/s
                    except ValueError:
                        raise fail(
                            at(source, net.line), f"net speed must be a number of Mb/s, got {speed!r}"
                        ) from None
                    if not 0 < bw < 1e5:
                        raise fail(at(source, net.line), f"net speed {speed!r} Mb/s is out of range")
                if not name:
                    prefix = kind.prefix if kind else _class_prefix(pci)
                    name = f"{prefix}{sum(1 for n in nics if n[0].startswith(prefix))}"
                nics.append((name, e, bw, kind))
    if not gpus:
        raise fail(source.name, "no GPU found (no <gpu> and no PCI device of class 0x0302xx)")
    order = []
    for k, (_pci, gpu) in enumerate(gpus):
        dev = gpu.attrs.get("dev") if gpu is not None else None
        order.append((int(dev) if dev is not None and dev.isdigit() else k, k))
    if sorted(i for i, _ in order) != list(range(len(gpus))):
        raise fail(at(source, gpus[0][0].line), "GPU dev numbers must run 0..n-1 once each")
    by_dev = {dev: gpus[k] for dev, k in order}
    busid = {pci.attrs.get("busid", "").lower(): dev for dev, (pci, _) in by_dev.items()}
    hw = NodeHW(node_name(source), source.name, len(gpus))
    # A cloud VM's dump has no <nvlink> elements: NCCL learns NVLink from NVML at run time.
    hw.nvlink_known = saw_nvlink
    kinds = {gpu_kind(vendor=p.attrs.get("vendor", ""), device=p.attrs.get("device", "")) for p, _ in gpus}
    if len(kinds) == 1 and None not in kinds:
        hw.kind = kinds.pop()
        hw.model = hw.kind.model
    # NVLink counts: to NVSwitches (tclass 0x0680xx) per GPU, or straight to another GPU.
    switch_links = {dev: 0 for dev in by_dev}
    direct: dict[tuple[int, int], int] = {}
    for dev, (_, gpu) in by_dev.items():
        for link in gpu.children if gpu is not None else []:
            if link.tag != "nvlink":
                continue
            count = link.attrs.get("count", "1")
            if not count.isdigit() or not 0 < int(count) <= 64:
                raise fail(at(source, link.line), f"nvlink count must be 1..64, got {count!r}")
            target = link.attrs.get("target", "").lower()
            if target in busid:
                key = (dev, busid[target])
                direct[key] = direct.get(key, 0) + int(count)
            elif link.attrs.get("tclass", "").lower().startswith("0x0680"):
                switch_links[dev] += int(count)
    n = len(gpus)
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            links = min(switch_links[i], switch_links[j]) + max(direct.get((i, j), 0), direct.get((j, i), 0))
            hw.pairs[(i, j)] = f"NV{links}" if links else _pcie_class(by_dev[i][0], by_dev[j][0])
    for name, e, bw, kind in nics:
        # A <nic> element sits inside its PCI device; distances count from the device.
        if e.tag == "nic" and e.parent is not None and e.parent.tag == "pci":
            e = e.parent
        if name in hw.nics:
            raise fail(at(source, e.line), f"NIC {name!r} appears twice")
        hw.nics.append(name)
        if bw is not None:
            hw.nic_bw_GBps[name] = bw
        if kind is not None:
            hw.nic_vendor[name] = kind.vendor
            if kind.fabric:
                hw.nic_fabric[name] = kind.fabric
        elif e.attrs.get("class", "").lower().startswith("0x0200"):
            hw.nic_fabric[name] = "ethernet"
        for dev, (pci, _) in by_dev.items():
            hw.nic_class[(name, dev)] = _pcie_class(pci, e)
    for dev, (pci, _) in by_dev.items():
        cpu = next((x for x in pci.chain() if x.tag == "cpu"), None)
        if cpu is not None and "numaid" in cpu.attrs:
            hw.numa[dev] = cpu.attrs["numaid"]
    return hw


def _class_prefix(pci: Element) -> str:
    # Without a vendor id: InfiniBand-class devices are most often ConnectX (mlx5), others Ethernet.
    return "mlx5_" if pci.attrs.get("class", "").lower().startswith("0x0207") else "eth"


def import_xml(sources: list[Source], defaults: Defaults) -> Imported:
    """nccl-xml: one topology XML per node, merged into a cluster."""
    if not sources:
        raise fail("input", "nccl-xml needs at least one topology file")
    return nodes_to_spec([parse_nccl(s, defaults) for s in sources], defaults)
