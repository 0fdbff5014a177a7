"""The devices a plan is placed on: the common base (``base``), the ``cpu-device`` test
device (``cpu``) and the optional CUDA device (``cuda``)."""
