"""The box's health rules (app.core.hardware) and what a llama.cpp build carries (app.llama.cuda_arch)."""

from __future__ import annotations

import struct

import pytest

from app.core.hardware import (
    MINIMUMS,
    card_list,
    close_order,
    cuda_indexes,
    driver_checks,
    group_crossing,
    link_checks,
    topo_matrix,
)
from app.gpu.model import LINK_MULTIPLE, LINK_SINGLE, CardReading, FleetSnapshot, Topology, link_capacity_mib_s
from app.gpu.simulated import SimulatedSource
from app.llama.cuda_arch import PTX, SASS, Build, build_checks, build_of, coverage, scan


def fleet(driver: str | None, cuda: str | None, capabilities: list[str]) -> FleetSnapshot:
    cards = tuple(CardReading(i, f"GPU-{i}", compute_capability=c) for i, c in enumerate(capabilities))
    return FleetSnapshot(0.0, False, cards, Topology(), driver_version=driver, cuda_version=cuda)


# -- driver and CUDA against the architecture --------------------------------------------------------------------


@pytest.mark.parametrize(("driver", "cuda", "fails"), [
    ("570.86.15", "12.8", []),  # exactly the minimums
    ("575.57.08", "12.9", []),
    ("565.57.01", "12.8", ["driver 565.57.01 is too old"]),  # just below the driver minimum
    ("570.86.15", "12.7", ["CUDA 12.7 (what the driver supports) is too old"]),  # just below CUDA's
    ("565.57.01", "12.7", ["driver 565.57.01 is too old", "CUDA 12.7"]),
])
def test_blackwell_needs_driver_570_and_cuda_12_8(driver, cuda, fails):
    checks = driver_checks(fleet(driver, cuda, ["12.0"] * 8))
    failed = [line for ok, line in checks if ok is False]
    assert len(failed) == len(fails)
    for line, fragment in zip(failed, fails):
        assert fragment in line and "compute capability 12.0 (cards 0-7)" in line
    if fails:
        assert all("570" in line for line in failed)  # each names the minimum ...
        assert any("-DCMAKE_CUDA_ARCHITECTURES=120" in line or "install the 570 driver" in line for line in failed)
    else:
        assert checks == [(True, f"driver {driver} and CUDA {cuda} support compute capability 12.0 (cards 0-7)"
                                 " (needs driver 570+, CUDA 12.8+)")]


def test_an_old_driver_is_fine_for_an_older_architecture_and_each_architecture_is_judged_alone():
    checks = driver_checks(fleet("535.183.01", "12.2", ["8.9", "8.9", "12.0"]))
    assert [(ok, line.split(":")[0]) for ok, line in checks] == [
        (False, "driver 535.183.01 is too old for compute capability 12.0 (cards 2)"),
        (False, "CUDA 12.2 (what the driver supports) is too old for compute capability 12.0 (cards 2)"),
        (True, "driver 535.183.01 and CUDA 12.2 support compute capability 8.9 (cards 0-1) (needs driver 520+, CUDA"
               " 11.8+)"),
    ]


def test_an_unknown_architecture_or_version_is_a_warning_not_a_failure():
    assert driver_checks(fleet("575.57.08", "12.9", ["13.7"]))[0][0] is None
    assert [ok for ok, _ in driver_checks(fleet(None, None, ["12.0"]))] == [None]
    assert set(MINIMUMS) >= {"12.0", "9.0", "8.9", "8.6", "8.0"}



def test_each_verdict_stands_alone_and_the_exact_minimum_is_enough():
    # a card lost to the driver keeps its capability, but is no architecture to judge
    cards = (CardReading(0, "GPU-0", compute_capability="12.0", lost=True), CardReading(1, "GPU-1", compute_capability="9.0"))
    snapshot = FleetSnapshot(0.0, False, cards, Topology(), driver_version="520", cuda_version="11.8")
    assert driver_checks(snapshot) == [
        (True, "driver 520 and CUDA 11.8 support compute capability 9.0 (cards 1) (needs driver 520+, CUDA 11.8+)")]
    # one failure is the whole verdict: no ok line beside it
    assert driver_checks(fleet("565.57.01", "12.8", ["12.0"])) == [
        (False, "driver 565.57.01 is too old for compute capability 12.0 (cards 0): it needs 570 or newer; install the"
                " 570 driver (or newer) and reboot")]
    # an architecture not in the table leaves the next one judged (the table's order: "7.2" < "8.9")
    assert [ok for ok, _ in driver_checks(fleet("575.57.08", "12.9", ["7.2", "8.9"]))] == [None, True]
    # either version missing is a warning, not an ok
    assert driver_checks(fleet("570.86.15", None, ["12.0"])) == [
        (None, "compute capability 12.0 (cards 0): the driver did not say its version (driver 570.86.15, CUDA None);"
               " check nvidia-smi")]

# -- links -------------------------------------------------------------------------------------------------------


def card(index: int, **fields) -> CardReading:
    healthy = dict(pcie_gen=5, pcie_width=16, pcie_max_gen=5, pcie_max_width=16, behind_chipset=False,
                   utilization_pct=50)
    return CardReading(index, f"GPU-{index}", **{**healthy, **fields})


def test_a_narrow_link_a_slow_link_under_load_and_the_chipset_are_warnings():
    checks = link_checks([card(0), card(1, pcie_width=8, slot="3"), card(2, pcie_gen=3), card(3, behind_chipset=True),
                          card(4, pcie_gen=1, utilization_pct=0)])  # idle at Gen 1: power saving, no fault
    assert all(ok is None for ok, _ in checks)
    lines = [line for _, line in checks]
    assert lines == [
        "card 1 (slot 3): PCIe x8 of its x16; multi-card work will crawl: move it to a full-width slot wired to the CPU",
        "card 2: PCIe Gen 3 of its Gen 5 under load: check the slot's and riser's generation (BIOS, the riser's rating)",
        "card 3: behind the chipset (PCH), sharing its one uplink to the CPU: move it to a slot wired to the CPU",
    ]


def test_a_slow_link_is_judged_against_the_cards_maximum_only_under_load():
    """Idle, or its utilisation unknown: Gen 1 is power saving, no warning. At 1 % it is under load and Gen 4 of its
    Gen 5 is a warning; a Gen 4 card at its own Gen 4 (another card's maximum is 5) is fine.
    Nearest wrong versions:
    - an unknown utilisation (None) taken as load: a warning for an idle card
    - load only above some threshold (1 % idle), or the generation judged idle too
    - one maximum for every card (the fleet's best): the Gen 4 card warned"""
    checks = link_checks([card(0, pcie_gen=1, utilization_pct=None), card(1, pcie_gen=1, utilization_pct=0),
                          card(2, pcie_gen=4, utilization_pct=1), card(3, pcie_gen=4, pcie_max_gen=4)])
    assert checks == [(None, "card 2: PCIe Gen 4 of its Gen 5 under load: check the slot's and riser's generation"
                             " (BIOS, the riser's rating)")]
    assert link_checks([card(0, pcie_gen=1, utilization_pct=None), card(1, pcie_gen=4, pcie_max_gen=4)]) == [
        (True, "PCIe links: every card at its full width, none behind the chipset (cards 0-1)")]


def test_a_lost_card_is_skipped_not_the_end_of_the_list():
    assert link_checks([card(0, lost=True), card(1, behind_chipset=True)]) == [
        (None, "card 1: behind the chipset (PCH), sharing its one uplink to the CPU: move it to a slot wired to the CPU")]


def test_healthy_links_are_one_ok_line():
    assert link_checks([card(0), card(1), card(2, lost=True)]) == [
        (True, "PCIe links: every card at its full width, none behind the chipset (cards 0-1)")]


def test_link_capacity_by_generation_and_width():
    assert link_capacity_mib_s(5, 16) == pytest.approx(60096, rel=1e-3)  # 32 GT/s x 16 lanes, 128b/130b
    assert link_capacity_mib_s(4, 16) == pytest.approx(link_capacity_mib_s(5, 8))
    assert link_capacity_mib_s(None, 16) is None


# -- the chassis table and topology ------------------------------------------------------------------------------


def test_cuda_numbers_follow_the_pci_bus_not_nvmls_index():
    cards = [CardReading(0, "a", pci_bus_id="00000000:81:00.0"), CardReading(1, "b", pci_bus_id="00000000:01:00.0"),
             CardReading(2, "c", pci_bus_id="00000000:C1:00.0"), CardReading(3, "d")]
    assert cuda_indexes(cards) == {1: 0, 0: 1, 2: 2}


def test_cuda_numbers_order_bus_ids_by_their_value_whatever_their_case():
    """NVML writes bus ids in capitals, sysfs and a hand in lower case: 0a sorts after 09 and before C1 either way.
    Wrong version: the ids compared as written ("C1" < "a1", capitals before lower case)."""
    cards = [CardReading(0, "a", pci_bus_id="00000000:C1:00.0"), CardReading(1, "b", pci_bus_id="00000000:a1:00.0"),
             CardReading(2, "c", pci_bus_id="00000000:09:00.0")]
    assert cuda_indexes(cards) == {2: 0, 1: 1, 0: 2}


def test_topo_matrix_and_the_close_order_of_the_default_fleet():
    snapshot = SimulatedSource(clock=lambda: 1000.0).read()
    found = topo_matrix(snapshot)
    assert found["matrix"][1] == ["PXB", "X", "PXB", "PXB", "SYS", "SYS", "SYS", "SYS"]
    assert found["numa"] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert close_order(snapshot) == list(range(8))


def test_close_order_groups_cards_of_one_switch_even_when_their_numbers_interleave():
    cards = tuple(CardReading(i, f"GPU-{i}", numa_node=i % 2, pci_bus_id=f"00000000:{i + 1:02X}:00.0")
                  for i in range(4))
    links = {(0, 2): LINK_SINGLE, (1, 3): LINK_MULTIPLE}
    assert close_order(FleetSnapshot(0.0, False, cards, Topology(links))) == [0, 2, 1, 3]


def test_close_order_sorts_by_numa_node_then_bus_and_a_pxb_pair_is_close():
    # no two cards close: the order is the sort itself. NUMA node first (an unknown node last), then the bus (none first)
    cards = (CardReading(0, "a", numa_node=1, pci_bus_id="00000000:01:00.0"),
             CardReading(1, "b", numa_node=0, pci_bus_id="00000000:C1:00.0"),
             CardReading(2, "c", numa_node=None, pci_bus_id="00000000:00:00.0"),
             CardReading(3, "d", numa_node=0, pci_bus_id="00000000:81:00.0"),
             CardReading(4, "e", numa_node=0))
    assert close_order(FleetSnapshot(0.0, False, cards, Topology())) == [4, 3, 1, 0, 2]
    # cards behind one PCIe switch tree (PXB, nvidia-smi's multiple bridges) group like those on one switch (PIX)
    bus = tuple(CardReading(i, f"GPU-{i}", numa_node=0, pci_bus_id=f"00000000:{i + 1:02X}:00.0") for i in range(3))
    assert close_order(FleetSnapshot(0.0, False, bus, Topology({(0, 2): LINK_MULTIPLE}))) == [0, 2, 1]


def test_topo_matrix_names_its_cards_and_reads_a_level_nvidia_smi_has_no_name_for_as_sys():
    cards = tuple(CardReading(i, f"GPU-{i}", numa_node=None) for i in (3, 5))
    found = topo_matrix(FleetSnapshot(0.0, False, cards, Topology({(3, 5): 35})))  # NVML may add levels
    assert found == {"cards": [3, 5], "matrix": [["X", "SYS"], ["SYS", "X"]], "numa": [None, None]}


def test_a_group_across_switches_or_numa_nodes_gets_a_note_and_a_close_one_none():
    snapshot = SimulatedSource(clock=lambda: 1000.0).read()
    assert group_crossing(snapshot.topology, snapshot.cards, [0, 1, 2, 3]) is None
    assert group_crossing(snapshot.topology, snapshot.cards, [4, 5]) is None  # the cards left out span both nodes
    assert group_crossing(snapshot.topology, snapshot.cards, [3, 4]) == (
        "cards 3-4 cross a PCIe switch and span NUMA nodes 0,1: traffic between them goes through the CPU;"
        " prefer --split-mode layer")
    assert card_list([0, 1, 2, 5, 7, 6]) == "0-2,5-7"


# -- llama.cpp builds --------------------------------------------------------------------------------------------


def fatbin(*entries: tuple[int, int], header: int = 64, payload: bytes = b"\x7fELF" + bytes(12), version: int = 1,
           header_size: int = 16) -> bytes:
    """A fat binary container holding (kind, arch) entries, each with a `header`-byte header and `payload`."""
    body = b""
    for kind, arch in entries:
        body += struct.pack("<HHIQIIHHI", kind, 0x101, header, len(payload), 0, 0, 8, 1, arch) + bytes(max(0, header - 32))
        body += payload
    return struct.pack("<IHHQ", 0xBA55ED50, version, header_size, len(body)) + bytes(header_size - 16) + body


def test_the_embedded_architectures_are_read_from_the_fat_binaries():
    data = b"junk" * 100 + fatbin((SASS, 89), (SASS, 120), (PTX, 120)) + b"more" + fatbin((SASS, 86))
    assert scan(data) == Build(frozenset({86, 89, 120}), frozenset({120}))
    assert scan(b"no cuda here") == Build()
    assert scan(b"\x50\xed\x55\xba" + b"\xff" * 8) == Build()  # a magic number by chance, then nonsense


def test_every_container_is_read_and_each_only_as_far_as_it_is_a_fat_binary():
    """Three containers (the middle one read too); entries of the shortest header (32 bytes, no payload), the last
    ending the container exactly; an entry whose header is too short ends its container only; an entry of another
    kind (neither PTX nor ELF) counts for nothing; a container of another version or header size is skipped.
    Wrong versions: the search jumping to the last container; the last short entry dropped, or a 32-byte header
    taken as too short; the whole scan ended at a bad entry; another kind read as PTX; version or header size
    alone enough."""
    data = fatbin((SASS, 50)) + b"x" + fatbin((SASS, 61)) + b"y" + fatbin((PTX, 70))
    assert scan(data) == Build(frozenset({50, 61}), frozenset({70}))
    assert scan(fatbin((SASS, 89), (SASS, 120), header=32, payload=b"")) == Build(frozenset({89, 120}))
    bad = fatbin((SASS, 75), header=8, payload=b"") + fatbin((SASS, 86))
    assert scan(bad) == Build(frozenset({86}))
    assert scan(fatbin((4, 90), (0, 80), (SASS, 86))) == Build(frozenset({86}))
    assert scan(fatbin((SASS, 90), version=2) + fatbin((SASS, 80), header_size=24)) == Build()


@pytest.mark.parametrize(("build", "capability", "expected"), [
    (Build(frozenset(), frozenset({120})), "12.0", "ptx"),  # PTX for the card's own architecture: JIT too
    (Build(frozenset({120})), "12.0", "sass"),
    (Build(frozenset({86})), "8.9", "sass"),  # sm_86 code runs on 8.9: same major, lower minor
    (Build(frozenset({89})), "8.6", "none"),  # but not the other way round
    (Build(frozenset({89}), frozenset({89})), "12.0", "ptx"),  # newer card, older PTX: JIT
    (Build(frozenset({90}), frozenset()), "12.0", "none"),
])
def test_coverage(build, capability, expected):
    assert coverage(build, capability) == expected


def test_build_checks_name_the_fix(tmp_path):
    server = tmp_path / "llama-server"
    server.write_bytes(b"\x7fELF" + fatbin((SASS, 89), (PTX, 89)))
    (tmp_path / "libggml-cuda.so").write_bytes(fatbin((SASS, 86)))
    build = build_of(server)
    assert build == Build(frozenset({86, 89}), frozenset({89}))
    [(ok, line)] = build_checks(build, ["12.0"], "llama-server")
    assert ok is None and "PTX JIT" in line and "-DCMAKE_CUDA_ARCHITECTURES=120" in line
    [(ok, line)] = build_checks(Build(frozenset({90})), ["12.0"], "llama-server")
    assert ok is False and "no kernel image is available" in line and "-DCMAKE_CUDA_ARCHITECTURES=120" in line
    [(ok, line)] = build_checks(Build(), ["12.0"], "llama-server")
    assert ok is False and "CPU build" in line
    assert build_checks(Build(frozenset({120})), ["12.0"], "llama-server")[0][0] is True


def test_build_checks_word_each_verdict_with_the_builds_native_architectures(tmp_path):
    """Every line a member reads, whole, one per architecture in the order of their numbers (7.5 before 12.0): the
    build's SASS listed sm_86,sm_89 (or "none"); a CPU build says so for every architecture among the cards.
    Wrong versions: capabilities sorted as text (12.0 first); another separator or spelling of the list; the list
    lost; a CPU build's second line dropped."""
    both = Build(frozenset({89, 86}), frozenset({89}))
    fix = "rebuild llama.cpp with cmake -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="
    assert build_checks(both, ["8.9", "12.0", "7.5", "8.9"], "llama-server") == [
        (False, "llama-server has no code for compute capability 7.5 (sm_86,sm_89): it fails with"
                f' "no kernel image is available"; {fix}75'),
        (True, "llama-server carries native code for compute capability 8.9 (sm_86,sm_89)"),
        (None, f"llama-server has no sm_120 code, only PTX (sm_86,sm_89): it runs through PTX JIT, slow to start and"
               f" slower; {fix}120")]
    assert build_checks(Build(frozenset(), frozenset({89})), ["12.0"], "llama-server") == [
        (None, f"llama-server has no sm_120 code, only PTX (none): it runs through PTX JIT, slow to start and slower;"
               f" {fix}120")]
    assert build_checks(Build(), ["8.6", "12.0"], "x") == [
        (False, f"x has no CUDA code (a CPU build): it cannot use the cards; {fix}86"),
        (False, f"x has no CUDA code (a CPU build): it cannot use the cards; {fix}120")]


def test_a_library_that_cannot_be_read_is_passed_over_and_the_next_one_read(tmp_path):
    """libggml-cuda.so a dangling link (a package half removed), libggml-cuda.so.1 the real library.
    Wrong version: the first unreadable file ends the reading."""
    server = tmp_path / "llama-server"
    server.write_bytes(b"\x7fELF")
    (tmp_path / "libggml-cuda.so").symlink_to(tmp_path / "libggml-cuda.so.0")
    (tmp_path / "libggml-cuda.so.1").write_bytes(fatbin((SASS, 120)))
    assert build_of(server) == Build(frozenset({120}))
