"""`--to hf`, the Hub folder: its target class (`target.py`); what writes it is the converter's
(converter/hf_folder.py).
"""
