"""The booked hardware the plan is made for, as a resource (key `booked_hardware`).

Until the booking lookup of the canonical API is wired here, the hardware is configured: the
embedded default is one node of eight H100 SXM on InfiniBand at 250 cents per GPU-hour, an
illustrative price of the order of 2025 on-demand H100 rates; a booking's own price replaces it.
"""

from ito_assets.defs.resources import StrictResource
from ito_assets.training.hardware import gpu_spec, network_spec
from ito_assets.training.planner import Hardware


class BookedHardwareResource(StrictResource):
    gpu_type: str = "H100-SXM"
    num_nodes: int = 1
    gpus_per_node: int = 8
    network: str = "infiniband"
    price_cents_per_gpu_hour: int = 250

    def hardware(self) -> Hardware:
        return Hardware(gpu=gpu_spec(self.gpu_type), network=network_spec(self.network), num_nodes=self.num_nodes,
                        gpus_per_node=self.gpus_per_node, price_cents_per_gpu_hour=self.price_cents_per_gpu_hour)
