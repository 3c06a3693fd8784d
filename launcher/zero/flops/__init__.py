"""FLOPs: counted per module with ``torch.utils.flop_counter``, the profiler's report, and MFU.

``counter`` counts (matrix products and attention, forward and backward), ``report`` renders a
profile as text, ``profiler`` is DeepSpeed's ``FlopsProfiler`` / ``get_model_profile`` API, and
``peak`` knows the cards' peak TFLOP/s for the progress line's MFU.
"""
