// Why: NOT Android: a stand-in with the signatures of android.net.LocalSocketAddress that the
// Android transport uses, so clients/jvm/build can type-check it without an android.jar.
package android.net;

public class LocalSocketAddress {
    public enum Namespace { ABSTRACT, RESERVED, FILESYSTEM }

    public LocalSocketAddress(String name, Namespace namespace) {
        throw new UnsupportedOperationException("stub");
    }
}
