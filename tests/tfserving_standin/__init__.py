"""A stand-in for ``tensorflow_model_server`` (``server.py``) and the small SavedModels
(``savedmodels.py``) the TF Serving backend tests use. Test code only."""
