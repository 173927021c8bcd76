"""The configuration: each setting declared once (`settings`), its checks, the layered loading of profiles (`config`), the providers' facts and routes."""
