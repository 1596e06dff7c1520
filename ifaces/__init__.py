"""Package marker: the FTN3 iface definitions ship as package data (ifaces/ in the source tree)."""
