"""`board cards [--json|--labels|--csv]` (the chassis table) and `board topo [--json]` (which cards are close)."""

from __future__ import annotations

from app.output import EXIT_OK, print_json, table

CARDS_HELP = "the chassis table: each card's serial, PCI bus id, slot, NUMA node, PCIe link and power limits"
LABELS_NOTE = ("Print this and stick it on the chassis: CUDA numbers follow the PCI bus (CUDA_DEVICE_ORDER=PCI_BUS_ID,"
               " as board run sets it), not the slots.")
CSV_COLUMNS = ("index", "cuda_index", "uuid", "serial", "pci_bus_id", "slot", "numa_node", "label", "pcie_gen",
               "pcie_width", "pcie_max_gen", "pcie_max_width", "behind_chipset", "power_limit_w", "power_default_w",
               "power_max_w", "persistence", "compute_capability")
LEGEND = ("X = itself, PIX = one PCIe switch, PXB = several PCIe switches, PHB = a PCIe host bridge (the CPU),"
          " NODE = host bridges within a NUMA node, SYS = across NUMA nodes (the CPUs' interconnect)")


def add_parser(command) -> None:
    p = command("cards", cmd_cards, CARDS_HELP, json_flag=True)
    how = p.add_mutually_exclusive_group()
    how.add_argument("--labels", action="store_true", help="a table to print and stick on the box")
    how.add_argument("--csv", action="store_true", help="CSV, one row per card")
    command("topo", cmd_topo, "the cards' topology matrix (as nvidia-smi topo -m) and the order to give llama.cpp",
            json_flag=True)


def _read(ctx):
    """The snapshot, and each card's label as board status shows it (the config's labels over the scenario's)."""
    from app.gpu.model import snapshot_from_wire

    snapshot = snapshot_from_wire(ctx.client.call("fleet"))
    labels = {c["index"]: c.get("label") for c in ctx.client.call("status")["cards"]}
    return snapshot, labels


def card_json(card, cuda_index: int | None, label: str | None) -> dict:
    return {
        "index": card.index, "cuda_index": cuda_index, "uuid": card.uuid, "name": card.name, "serial": card.serial,
        "pci_bus_id": card.pci_bus_id, "slot": card.slot, "numa_node": card.numa_node, "label": label,
        "compute_capability": card.compute_capability, "persistence": card.persistence,
        "pcie": {"gen": card.pcie_gen, "width": card.pcie_width, "max_gen": card.pcie_max_gen,
                 "max_width": card.pcie_max_width, "behind_chipset": card.behind_chipset},
        "power": {"limit_w": card.power_limit_w, "default_w": card.power_default_w, "max_w": card.power_max_w},
    }


def cmd_cards(ctx) -> int:
    from app.core.hardware import cuda_indexes
    from app.core.text import inert  # serials, slots and labels come from hardware and the config: shown inert

    snapshot, labels = _read(ctx)
    cuda = cuda_indexes(snapshot.cards)
    rows = [card_json(c, cuda.get(c.index), labels.get(c.index)) for c in snapshot.cards]
    args = ctx.args

    def text(value, width: int = 40) -> str:
        return "-" if value is None else inert(str(value), width)

    if args.json:
        print_json({"driver_version": snapshot.driver_version, "cuda_version": snapshot.cuda_version, "cards": rows})
    elif args.csv:
        import csv
        import sys

        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        for row in rows:
            flat = {**row, **{f"pcie_{k}" if k != "behind_chipset" else k: v for k, v in row["pcie"].items()},
                    **{f"power_{k}": v for k, v in row["power"].items()}}
            writer.writerow(["" if flat[k] is None else inert(str(flat[k]), 80) for k in CSV_COLUMNS])
    elif args.labels:
        lines = [["CARD", "CUDA", "SERIAL", "PCI BUS ID", "SLOT", "LABEL"]]
        lines += [[str(r["index"]), text(r["cuda_index"]), text(r["serial"]), text(r["pci_bus_id"]), text(r["slot"]),
                   text(r["label"])] for r in rows]
        print(table(lines))
        print(LABELS_NOTE)
    else:
        lines = [["#", "CUDA", "SERIAL", "PCI BUS ID", "SLOT", "NUMA", "PCIE", "CHIPSET", "POWER W", "CC", "LABEL"]]
        for r in rows:
            pcie, power = r["pcie"], r["power"]
            link = (f"Gen{text(pcie['gen'])} x{text(pcie['width'])}"
                    f" (of Gen{text(pcie['max_gen'])} x{text(pcie['max_width'])})")
            watts = f"{_w(power['limit_w'])} ({_w(power['default_w'])}/{_w(power['max_w'])})"
            chipset = {True: "BEHIND", False: "no", None: "-"}[pcie["behind_chipset"]]
            lines.append([str(r["index"]), text(r["cuda_index"]), text(r["serial"]), text(r["pci_bus_id"]),
                          text(r["slot"]), text(r["numa_node"]), link, chipset, watts, text(r["compute_capability"]),
                          text(r["label"])])
        print(table(lines))
        print(f"driver {text(snapshot.driver_version)}, CUDA {text(snapshot.cuda_version)};"
              " POWER W: the limit now (default/max)")
    return EXIT_OK


def _w(value) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def cmd_topo(ctx) -> int:
    from app.core.hardware import close_order, cuda_indexes, topo_matrix
    from app.gpu.model import snapshot_from_wire

    snapshot = snapshot_from_wire(ctx.client.call("fleet"))
    found = topo_matrix(snapshot)
    order = close_order(snapshot)
    cuda = cuda_indexes(snapshot.cards)
    if ctx.args.json:
        print_json({**found, "order": order})
        return EXIT_OK
    names = [f"GPU{i}" for i in found["cards"]]
    lines = [["", *names, "NUMA"]]
    for name, row, numa in zip(names, found["matrix"], found["numa"]):
        lines.append([name, *row, "-" if numa is None else str(numa)])
    print(table(lines))
    print(LEGEND)
    visible = ",".join(str(cuda[i]) for i in order if i in cuda)
    print(f"close cards first: {','.join(map(str, order))}"
          f" (CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES={visible} for all of them in llama.cpp)")
    return EXIT_OK


def hardware_checks(ctx):
    """board doctor's part on the box: driver and CUDA for the cards' architecture, the llama-server build, each
    card's PCIe link, each card's power limit against [power], and the catalog's models against the cards. (ok,
    line) pairs; ok is None for a warning."""
    from app.core.hardware import by_capability, driver_checks, link_checks, power_checks
    from app.errors import BoardError
    from app.gpu import NoDriverError

    try:
        snapshot = _snapshot_for_doctor(ctx)
    except (BoardError, NoDriverError, ValueError) as error:  # no driver, no service: the rest of doctor still runs
        yield None, f"cards not read ({error}): the driver and link checks are skipped"
        return
    yield from driver_checks(snapshot)
    yield from _build_checks(ctx, list(by_capability(snapshot.cards)))
    yield from link_checks(snapshot.cards)
    yield from power_checks(snapshot.cards, ctx.config.power.policy_w)
    yield from _catalog_checks(ctx.config, snapshot.cards)


def _catalog_checks(config, cards):
    """The catalog ([[models]]) against these cards and the model files this user can read: what `board agent`
    refuses to start with, a FIX line each."""
    if not config.models:
        return
    from app.llama.catalog import check_catalog

    bad = check_catalog(config, cards)
    yield from ((False, line) for line in bad)
    if not bad:
        yield True, f"the catalog's {len(config.models)} model(s) can run on this box's cards ([[models]])"


def _snapshot_for_doctor(ctx):
    """Through the service where there is one; else straight from the cards, so that doctor creates no database."""
    if ctx.config.service.socket:
        from app.gpu.model import snapshot_from_wire

        return snapshot_from_wire(ctx.client.call("fleet"))
    from app.gpu import open_source

    source = open_source(ctx.demo, host=ctx.config.fleet.host)
    try:
        return source.read()
    finally:
        source.close()


def _build_checks(ctx, capabilities: list[str]):
    from app.errors import BoardError
    from app.llama.binary import find_server_bin
    from app.llama.cuda_arch import build_checks, build_of

    if not capabilities:
        return
    try:
        server_bin = find_server_bin(ctx.config.llama, ctx.environ)
    except BoardError as error:
        yield None, f"llama-server's build not checked: {error}"
        return
    yield from build_checks(build_of(server_bin), capabilities, f"llama-server ({server_bin})")
