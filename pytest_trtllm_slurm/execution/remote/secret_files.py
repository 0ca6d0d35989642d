"""Which files look like secrets (by name, and a few credential folders such as ``.ssh``),
so code sync never ships them unless ``sync_secrets = true``: the list errs on the side of
withholding (a false negative leaks a key)."""

from __future__ import annotations

import fnmatch
from pathlib import PurePosixPath

# file names (fnmatch, lower case)
SECRET_NAME_PATTERNS = (
    ".env*", "*.env",
    "*.pem", "*.key", "*.p12", "*.pfx", "*.jks", "*.keystore", "*.ppk", "*.kdbx",
    "id_rsa", "id_dsa", "id_ecdsa", "id_ed25519", "id_ecdsa_sk", "id_ed25519_sk",
    "*_rsa", "*_dsa", "*_ecdsa", "*_ed25519",
    ".netrc", "_netrc", ".pgpass", ".git-credentials", ".npmrc", ".pypirc", ".htpasswd",
    ".dockercfg", "credentials", "credentials.json", "credentials.yaml", "credentials.yml",
    "credentials.toml", "credentials.ini", "credentials.txt", "*.credentials",
    "secrets.json", "secrets.yaml", "secrets.yml", "secrets.toml", "secrets.env",
    ".secrets", "*.secret", "*.secrets",
    "service-account*.json", "service_account*.json",
    "token", ".token", "*.token", "*_token", ".vault-token",
    # cloud credentials under their usual names
    "gha-creds-*.json", "application_default_credentials.json", "client_secret*.json",
    "key.json", "*-key.json", "*_key.json", "keyfile.json", "*.keyfile", "sa.json",
    "adc.json", "access_tokens.db", "credentials.db", "legacy_credentials", "*.tfvars",
    "terraform.tfstate*", "*.kubeconfig", "kubeconfig", ".boto", "boto.cfg", ".s3cfg",
    "rclone.conf", ".databrickscfg", ".wandb", ".huggingface-token", "*.ovpn",
    "*.jwt", "*.sops.*", ".git-credentials*", "aws-exports.js", "*.asc", "*.gpg",
)
# folders whose files are credentials whatever their names
SECRET_DIRS = (".ssh", ".aws", ".gnupg", ".docker", ".kube", ".azure", ".gcloud",
               "gcloud", ".oci", ".terraform.d", ".password-store")


def looks_secret(path: str) -> bool:
    """True when ``path`` (relative, ``/``-separated) looks like a credential file."""
    parts = PurePosixPath(path).parts
    if not parts:
        return False
    name = parts[-1].lower()
    if any(d in SECRET_DIRS for d in (p.lower() for p in parts[:-1])):
        return True
    if name.startswith("id_") and "." not in name:  # ssh keys under any name (id_work)
        return True
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in SECRET_NAME_PATTERNS)
