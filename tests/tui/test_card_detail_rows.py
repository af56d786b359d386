"""The card detail's PCIe and topology rows (issue 23), as text: a narrow link and the chipset stand out."""

from __future__ import annotations

from app.gpu.model import CardReading
from app.gpu.simulated import SimulatedSource
from app.tui.screens.card_detail import link_text, topology_text


def test_a_healthy_link_its_traffic_and_place():
    card = SimulatedSource(clock=lambda: 1000.0).read().cards[0]
    text = link_text(card)
    assert text.plain == (f"PCIe Gen5 x16 of Gen5 x16 · TX {card.pcie_tx_mib_s / 1024:.1f}"
                          f" RX {card.pcie_rx_mib_s / 1024:.1f} GiB/s · slot 1 · NUMA 0")
    assert not any("reverse" in str(span.style) for span in text.spans)


def test_a_narrow_link_behind_the_chipset_stands_out_and_unknowns_say_n_a():
    text = link_text(CardReading(5, "GPU-5", pcie_gen=3, pcie_width=4, pcie_max_gen=5, pcie_max_width=16,
                                 behind_chipset=True, slot="SLOT7\x1b[31m"))
    assert text.plain.startswith("PCIe Gen3 x4 of Gen5 x16 BEHIND CHIPSET · slot SLOT7")
    assert "\x1b" not in text.plain  # the slot's name comes from the firmware: shown inert
    marked = [text.plain[span.start:span.end] for span in text.spans if "reverse" in str(span.style)]
    assert marked == ["Gen3 x4", " BEHIND CHIPSET"]
    assert link_text(CardReading(1, "GPU-1")).plain == "PCIe n/a"


def test_an_idle_cards_gen_1_link_does_not_stand_out():
    """An idle card drops its link to Gen 1 to save power: at its full width it is no fault, and says so plainly.
    Nearest wrong versions:
    - the generation now compared with the maximum: every idle card marked
    - a link at its full width marked too (<= for <)"""
    text = link_text(CardReading(0, "GPU-0", pcie_gen=1, pcie_width=16, pcie_max_gen=5, pcie_max_width=16,
                                 utilization_pct=0))
    assert text.plain == "PCIe Gen1 x16 of Gen5 x16"
    assert not any("reverse" in str(span.style) for span in text.spans)
    narrow = link_text(CardReading(1, "GPU-1", pcie_gen=1, pcie_width=8, pcie_max_gen=4, pcie_max_width=16))
    assert [narrow.plain[s.start:s.end] for s in narrow.spans if "reverse" in str(s.style)] == ["Gen1 x8"]
    full = link_text(CardReading(2, "GPU-2", pcie_gen=1, pcie_width=8, pcie_max_gen=4, pcie_max_width=8))
    assert not any("reverse" in str(span.style) for span in full.spans)


def test_the_other_cards_by_closeness():
    snapshot = SimulatedSource(clock=lambda: 1000.0).read()
    assert topology_text(snapshot, 5).plain == "topology: PXB 4,6-7 · SYS 0-3"
