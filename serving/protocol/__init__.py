"""Wire types of the Open Inference Protocol (V2) and KServe V1, and the tensor codec.

Pure: no HTTP framework, no asyncio. The REST adapter in serving/replica.py calls in here.
"""
