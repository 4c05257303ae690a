"""Signals between the layers above topology that may not import each other."""

from django.dispatch import Signal

# A node agent's sync carried the node's NIC byte counters (sender: the agent sync view;
# kwargs: node_id, counters [{device, port, tx_bytes, rx_bytes}], at). The metrics app stores them
# as it stores an exporter's InfiniBand counters; the executors app (the sync) may not import it.
nic_counters_received = Signal()
