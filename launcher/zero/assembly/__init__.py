"""Assembly, the top layer: ``initialize`` builds either engine from a config, a model and the process
group (initialize.py: the data-parallel engine; initialize_pipeline.py: the pipeline engine)."""
