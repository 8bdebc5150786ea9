"""Mode Lab dashboard (Streamlit): Home.py and pages/ are the entry points; common, queries and charts are shared."""
